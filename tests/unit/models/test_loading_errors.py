"""What transformers, safetensors, tokenizers, json and the filesystem raise while loading or saving
a model becomes one ModelError line that names the folder, the damaged file and what to do."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file

from rlhfkit.errors import ConfigError, ModelError
from rlhfkit.models import load_causal_lm, load_tokenizer, save_hf_folder, tiny_model_and_tokenizer
from rlhfkit.models.critic import Critic
from rlhfkit.models.loading import damaged_file, load_errors, read_config_json


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "good"
    model, tok = tiny_model_and_tokenizer(seed=0)
    save_hf_folder(model, tok, folder)
    return folder


def damaged(good, tmp_path, name, text: bytes | str):
    folder = tmp_path / "m"
    shutil.copytree(good, folder)
    if isinstance(text, str):
        (folder / name).write_text(text)
    else:
        (folder / name).write_bytes(text)
    return folder


@pytest.mark.parametrize("name,content,load,says", [
    ("model.safetensors", b"", load_causal_lm, "model.safetensors is truncated or corrupt (SafetensorError: "
                                               "Error while deserializing header: header too small)"),
    ("config.json", "{", load_causal_lm, "config.json is not valid JSON (Expecting property name enclosed in "
                                         "double quotes at line 1 column 2)"),
    ("config.json", "[1, 2]", load_causal_lm, "config.json holds a JSON list, not an object"),
    ("config.json", b"\xff\xfe{}", load_tokenizer, "config.json is not UTF-8 text"),
    ("tokenizer.json", "{", load_tokenizer, "tokenizer.json is not valid JSON (Expecting property name enclosed in "
                                            "double quotes at line 1 column 2)"),
    ("tokenizer_config.json", "null", load_tokenizer, "tokenizer_config.json holds a JSON NoneType, not an object"),
])
def test_a_damaged_file_is_named(good, tmp_path, name, content, load, says):
    folder = damaged(good, tmp_path, name, content)
    with pytest.raises(ModelError) as e:
        load(folder)
    what = "a causal LM" if load is load_causal_lm else "a tokenizer"
    assert str(e.value) == f"cannot load {what} from {folder}: {says}; re-save or re-download the model"


def test_a_multi_line_library_message_becomes_one_line(good, tmp_path):
    folder = damaged(good, tmp_path, "config.json",
                     json.dumps({**json.loads((good / "config.json").read_text()), "model_type": "no_such_arch"}))
    with pytest.raises(ModelError) as e:
        load_causal_lm(folder)
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 600
    assert msg.startswith(f"cannot load a causal LM from {folder}: ValueError: The checkpoint you are trying to load "
                          "has model type `no_such_arch`")
    assert msg.endswith("; check that it is a complete HF folder as save_pretrained writes it (config.json, "
                        "*.safetensors, tokenizer files) of an architecture this transformers version knows")


def test_weights_of_another_architecture_are_refused_not_initialised_at_random(good, tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(good, folder)
    save_file({"transformer.h.0.attn.c_attn.weight": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    with pytest.raises(ModelError,
                       match=r"hold no tensors for 21 parameters of LlamaForCausalLM \(e.g. lm_head.weight"):
        load_causal_lm(folder)


def test_a_critic_folder_with_a_damaged_value_head(good, tmp_path):
    critic = Critic.from_causal_lm(good)
    critic.save_pretrained(tmp_path / "critic")
    (tmp_path / "critic" / "value_head.safetensors").write_bytes(b"\x00" * 3)
    with pytest.raises(ModelError, match="cannot load a critic from .*value_head.safetensors is truncated or corrupt"):
        Critic.from_pretrained(tmp_path / "critic")


def test_load_errors_passes_rlhfkit_errors_through_and_names_a_plain_folder(tmp_path):
    with pytest.raises(ConfigError, match="^mine$"):
        with load_errors("a model", tmp_path):
            raise ConfigError("mine")
    with pytest.raises(ModelError) as e:
        with load_errors("a model", tmp_path / "nowhere"):
            raise KeyError("added_tokens")
    assert str(e.value).startswith(f"cannot load a model from {tmp_path / 'nowhere'}: KeyError: 'added_tokens'; check")
    assert damaged_file(tmp_path / "nowhere") is None and damaged_file(tmp_path) is None


def test_read_config_json(good, tmp_path):
    assert read_config_json(good)["model_type"] == "llama"
    (tmp_path / "config.json").write_text('{"a": 1,}')
    with pytest.raises(ModelError,
                       match=r"config.json is not valid JSON \(Expecting property name .* line 1 column 9\)"):
        read_config_json(tmp_path)
    with pytest.raises(ModelError, match=r"cannot read .*nowhere/config.json: No such file or directory"):
        read_config_json(tmp_path / "nowhere")


def test_saving_where_a_file_is_in_the_way(tmp_path):
    model, tok = tiny_model_and_tokenizer(seed=0)
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ModelError) as e:
        save_hf_folder(model, tok, tmp_path / "a_file")
    assert str(e.value) == (f"cannot write the model folder {tmp_path / 'a_file'}: File exists; a file is in the way: "
                            "choose a folder path, or move the file")
    with pytest.raises(ModelError, match="Not a directory; a part of the path is a file, not a folder"):
        save_hf_folder(model, tok, tmp_path / "a_file" / "final")
