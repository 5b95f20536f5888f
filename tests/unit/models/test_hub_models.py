"""Model names: a local path first, then a hub name read (offline) from a hub cache laid out by the
test; a missing hub name is one line that says how to fetch it."""

from __future__ import annotations

import pytest
import torch

from rlhfkit.errors import ModelError
from rlhfkit.models import load_causal_lm, load_tokenizer, tiny_model_and_tokenizer
from rlhfkit.models.loading import (
    is_hub_name,
    load_policy,
    resolve_model,
    resolve_model_file,
    resolve_model_path,
)


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    """An empty hub cache under tmp_path read offline (HF_HOME=tmp_path, HF_HUB_OFFLINE=1)."""
    from huggingface_hub import constants

    hub = tmp_path / "hf" / "hub"
    hub.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub


@pytest.fixture
def tiny_on_hub(tmp_path, offline_hub, hub_repo):
    """The tiny model saved, then laid out in the hub cache as org/tiny; (snapshot folder, model)."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    return hub_repo(offline_hub, "model", "org/tiny", tmp_path / "tiny"), model


@pytest.mark.parametrize("name,hub", [
    ("Qwen/Qwen2.5-0.5B-Instruct", True), ("gpt2", True), ("org/tiny", True),
    ("./tiny", False), ("/models/tiny", False), ("~/tiny", False), ("runs/rl/final", False),
    ("org/model.gguf", False), ("org/na me", False),
])
def test_which_names_are_hub_model_names(name, hub):
    assert is_hub_name(name) is hub


def test_hub_name_loads_from_the_cache_offline(tiny_on_hub):
    snapshot, model = tiny_on_hub
    assert resolve_model_path("org/tiny") == snapshot
    assert resolve_model_file("org/tiny", "config.json") == snapshot / "config.json"
    loaded = load_causal_lm("org/tiny")
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert load_tokenizer("org/tiny").chat_template is not None
    assert resolve_model("org/tiny") == (str(snapshot), None)
    policy, tok = load_policy("org/tiny", "float32")
    assert tok.pad_token is not None and sum(p.numel() for p in policy.parameters()) > 0


def test_a_local_folder_wins_over_a_hub_name(tmp_path, tiny_on_hub, monkeypatch):
    local = tmp_path / "cwd" / "org" / "tiny"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "cwd")
    assert resolve_model_path("org/tiny").resolve() == local


def test_missing_hub_model_offline_is_one_line_saying_how_to_fetch_it(offline_hub):
    for load in (load_causal_lm, load_tokenizer, resolve_model_path):
        with pytest.raises(ModelError) as info:
            load("rlhfkit-test/no-such-model")
        msg = str(info.value)
        assert "\n" not in msg
        assert msg.startswith("model 'rlhfkit-test/no-such-model': no local folder or file of that name, and it "
                              "is not in the Hugging Face cache (HF_HUB_OFFLINE is set, so the hub is not asked)")
        assert "`hf download rlhfkit-test/no-such-model`" in msg and "unset HF_HUB_OFFLINE" in msg
    with pytest.raises(ModelError, match="not in the Hugging Face cache"):
        resolve_model_file("rlhfkit-test/no-such-model", "config.json")


def test_a_missing_local_path_is_still_a_missing_folder(tmp_path):
    with pytest.raises(ModelError, match="model folder not found"):
        load_causal_lm(tmp_path / "nope")


def _http_error(cls, status: int):
    try:  # huggingface_hub 2 answers with httpx2's responses, 1.x with httpx's
        import httpx2 as http
    except ImportError:
        import httpx as http

    request = http.Request("GET", "https://huggingface.co/api/models/org/x")
    return cls("the hub said no", response=http.Response(status, request=request))


def test_hub_answers_become_one_line_model_errors(offline_hub, monkeypatch):
    """What the hub answers online (here raised by a stand-in for snapshot_download)."""
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    cases = [(_http_error(RepositoryNotFoundError, 404), "the Hugging Face hub has no model of that name"),
             (_http_error(GatedRepoError, 403), "the hub model is gated: accept its terms at "
                                                "https://huggingface.co/org/x and log in with `hf auth login`"),
             (OSError("No space left on device"), "fetching it from the Hugging Face hub failed (OSError: No space")]
    for exc, needle in cases:
        def raise_it(*args, exc=exc, **kwargs):
            raise exc

        monkeypatch.setattr(huggingface_hub, "snapshot_download", raise_it)
        with pytest.raises(ModelError) as info:
            resolve_model_path("org/x")
        assert needle in str(info.value) and "\n" not in str(info.value)
