"""`rlhfkit serve MODEL` on a saved tiny model (float32 and float16 weights) with the official `openai` SDK:
each of a request's n replies may take --max_tokens new tokens (the training endpoint's episode budget is not
the server's)."""

import pytest

openai = pytest.importorskip("openai")

from rlhfkit.cli.serve_model import build_server  # noqa: E402
from rlhfkit.config.parse import parse_config  # noqa: E402
from rlhfkit.config.serve_model import ServeModelConfig, validate_serve_model  # noqa: E402
from rlhfkit.models import tiny_model_and_tokenizer  # noqa: E402
from rlhfkit.models.loading import load_policy  # noqa: E402


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_each_of_n_replies_may_take_max_tokens(tmp_path, dtype):
    model, tok = tiny_model_and_tokenizer(seed=4)
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    cfg = parse_config(ServeModelConfig, ["--model", str(tmp_path / "m"), "--port", "0", "--max_tokens", "5",
                                          "--dtype", dtype])
    validate_serve_model(cfg)
    policy, tokenizer = load_policy(cfg.model, cfg.dtype)
    assert str(next(policy.parameters()).dtype) == f"torch.{dtype}"
    eos = tokenizer.eos_token_id
    with build_server(cfg, policy, tokenizer, "sk-test") as server:
        client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="sk-test", max_retries=0)
        reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], n=4,
                                               max_tokens=50, seed=1, extra_body={"top_k": 0})
    lengths = [len(c.token_ids) for c in reply.choices]
    assert len(lengths) == 4 and max(lengths) == 5  # lowered to --max_tokens each, not --max_tokens / n
    assert all(n == 5 or c.token_ids[-1] == eos for n, c in zip(lengths, reply.choices))
