"""Shared set-up of the integration tests: a folder with the tiny model saved as `tiny/`, the
prompts and, when asked, the "sevens" reward file."""

import json

import pytest
import torch

from rlhfkit.models import tiny_model_and_tokenizer

# Reward: the share of response characters that are "7" (dense, learnable by a tiny model).
SEVENS_REWARD = '''
import torch

def reward_func(queries, prompts, labels, **kwargs):
    responses = [q[len(p):] for q, p in zip(queries, prompts)]
    r = torch.tensor([sum(c == "7" for c in s) / 8.0 for s in responses])
    return {"rewards": r, "scores": r.clamp(0, 1), "extra_logs": {"sevens": r * 8}}
'''


@pytest.fixture(autouse=True)
def restore_threads():
    """Runs use --train.num_threads 1 (tiny models are faster on one thread); give the process its
    thread count back afterwards."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def tiny_ws(tmp_path_factory):
    """`tiny_ws(name, rows=None, sevens=False)`: a fresh folder with the tiny model + tokenizer in
    `tiny/`, when `rows` are given those records in `prompts.jsonl`, and with `sevens` the
    SEVENS_REWARD file as `reward.py`."""

    def make(name, rows=None, sevens=False):
        root = tmp_path_factory.mktemp(name)
        model, tok = tiny_model_and_tokenizer(seed=0)
        model.save_pretrained(root / "tiny")
        tok.save_pretrained(root / "tiny")
        if rows is not None:
            (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if sevens:
            (root / "reward.py").write_text(SEVENS_REWARD)
        return root

    return make
