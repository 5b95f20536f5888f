"""Models with a learned table of absolute positions (GPT-2, OPT) take at most that many tokens: the HF
engine ends a row there as at max_new_tokens, refuses a prompt that leaves no room, and the trainers lower
--data.prompt_max_len / --data.max_len to fit (a position past the table is an index error in the model)."""

import json

import pytest
import torch
import transformers

from rlhfkit.cli.main import main
from rlhfkit.errors import ConfigError
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.loading import position_limit
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from tests.integration.conftest import SEVENS_REWARD, rl_flags

LIMIT = 32


def test_the_limit_is_the_learned_tables_only():
    gpt2, _ = tiny_model_and_tokenizer(arch="gpt2", max_positions=LIMIT)
    opt = transformers.OPTForCausalLM(transformers.OPTConfig(  # its table has two more rows (an offset)
        vocab_size=40, hidden_size=16, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2,
        word_embed_proj_dim=16, max_position_embeddings=LIMIT))
    assert position_limit(gpt2) == LIMIT and position_limit(opt) == LIMIT
    for arch in ("llama", "gpt_neox", "bloom", "rwkv"):  # rotary, ALiBi, recurrent: no table
        assert position_limit(tiny_model_and_tokenizer(arch=arch, max_positions=LIMIT)[0]) is None


def test_rows_end_at_the_last_position_with_the_models_logprobs():
    model, tok = tiny_model_and_tokenizer(seed=0, arch="gpt2", max_positions=LIMIT)
    prompts = [tok("1+1=", add_special_tokens=False)["input_ids"], tok("x" * 25, add_special_tokens=False)["input_ids"]]
    trajs = HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=16, temperature=1.0, n=2),
                                          torch.Generator().manual_seed(0))
    long_rows = trajs[2:]
    assert all(len(t.response_ids) <= LIMIT - 25 for t in long_rows)
    assert any(len(t.response_ids) == LIMIT - 25 and t.finish_reason == "length" for t in long_rows)
    for t in trajs:  # the trainer's forward runs over the whole row: every position fits
        full = torch.cat([t.prompt_ids, t.response_ids])[None]
        assert full.shape[1] <= LIMIT
        with torch.no_grad():
            logits = model(full).logits[0, len(t.prompt_ids) - 1 : -1]
        want = torch.log_softmax(logits, -1).gather(-1, t.response_ids[:, None])[:, 0]
        torch.testing.assert_close(t.logprobs, want, atol=2e-5, rtol=0)
    with pytest.raises(ConfigError, match="leaves no room for a response"):
        HFEngine(model, tok).generate([[5] * LIMIT], SamplingParams(max_new_tokens=4))


def test_the_trainers_lower_their_lengths_to_the_table(tmp_path, capsys):
    model, tok = tiny_model_and_tokenizer(seed=0, arch="gpt2", max_positions=LIMIT)
    model.save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    rows = [{"q": "1+1=" * (2 if i % 2 else 10), "a": "2"} for i in range(8)]  # 8 and 40 tokens
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "reward.py").write_text(SEVENS_REWARD)
    argv = rl_flags(tmp_path, tmp_path / "rl", **{"rollout.batch_size": 2, "rollout.n_samples_per_prompt": 2,
                                                  "rollout.max_new_tokens": 30, "train.batch_size": 4,
                                                  "train.micro_batch_size": 4, "train.max_steps": 1,
                                                  "train.num_threads": 1})
    assert main(["train", "rl", *map(str, argv)]) == 0
    out = capsys.readouterr().out
    assert f"--data.prompt_max_len 1024 lowered to {LIMIT - 1}" in out and "skipped 4 prompts" in out
    evaluation = ["eval", "--actor.model_name_or_path", tmp_path / "tiny", "--eval.dataset", tmp_path / "prompts.jsonl",
                  "--data.input_key", "q", "--data.label_key", "a", "--reward.remote_url", tmp_path / "reward.py",
                  "--rollout.max_new_tokens", "30", "--actor.autocast", "none", "--ckpt.output_dir", tmp_path / "eval"]
    assert main([str(a) for a in evaluation]) == 0
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["skipped_prompts"] == 4
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps({"prompt": r["q"], "response": "2" * 20}) + "\n"
                                                for r in rows))
    argv = ["train", "sft", "--model.model_name_or_path", tmp_path / "tiny", "--data.dataset", tmp_path / "sft.jsonl",
            "--data.input_key", "prompt", "--data.output_key", "response", "--train.batch_size", "2",
            "--train.micro_batch_size", "2", "--train.max_steps", "1", "--logger.progress_bar", "false",
            "--train.num_threads", "1", "--ckpt.output_dir", tmp_path / "sft"]
    assert main([str(a) for a in argv]) == 0
    assert f"--data.max_len 2048 lowered to {LIMIT}" in capsys.readouterr().out
