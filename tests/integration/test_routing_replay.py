"""`rlhfkit train rl --actor.routing_replay` on a tiny Qwen3-MoE whose routers nearly tie two experts, under
bf16 autocast: the engine's decode steps and the trainer's forward round differently, which flips some tied
choices; replaying the engine's experts leaves only the rounding, so the logged rollout/trainer logprob gap
is smaller than without, and the run logs which share of the tokens it replayed."""

import json

import torch

from rlhfkit.cli.main import main
from rlhfkit.models.moe import replayable_routers
from rlhfkit.models.tiny import tiny_model_and_tokenizer

from .conftest import SEVENS_REWARD, rl_flags


def near_tied_moe(root):
    """A tiny 3-layer Qwen3-MoE whose routers score expert 1 at (1 + 1e-3) times expert 0, saved in `root/tiny`."""
    model, tok = tiny_model_and_tokenizer(seed=0, arch="qwen3_moe", layers=3)
    with torch.no_grad():
        for router in replayable_routers(model):
            router.weight[1] = router.weight[0] * (1 + 1e-3)
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": "7"} for i in range(16)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "reward.py").write_text(SEVENS_REWARD)
    return root


def run(ws, out, replay: bool) -> list[dict]:
    flags = rl_flags(ws, out, **{"actor.autocast": "bfloat16", "rollout.batch_size": "4",
                                 "rollout.n_samples_per_prompt": "2", "rollout.max_new_tokens": "8",
                                 "train.batch_size": "8", "train.micro_batch_size": "4", "train.max_steps": "2",
                                 "train.num_threads": "1", "algo.advantage.estimator": "group_norm",
                                 "actor.routing_replay": str(replay).lower()})
    assert main(["train", "rl", *map(str, flags)]) == 0
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_routing_replay_shrinks_the_rollout_trainer_logprob_gap(tmp_path):
    ws = near_tied_moe(tmp_path / "ws")
    plain = run(ws, tmp_path / "plain", replay=False)
    replayed = run(ws, tmp_path / "replayed", replay=True)
    assert "moe/replay_tokens" not in plain[0]
    for a, b in zip(plain, replayed):
        assert b["rollout/logprob_gap_max"] < a["rollout/logprob_gap_max"]
        assert b["moe/replay_tokens"] == 1.0  # every routed token's experts came from the engine
        assert 0.0 < b["moe/routing_mismatch"] < 0.5  # the trainer's routers would have flipped some
    print([(a["rollout/logprob_gap_max"], b["rollout/logprob_gap_max"], b["moe/routing_mismatch"])
           for a, b in zip(plain, replayed)])
