"""`rlhfkit serve-reward --reward.model_name_or_path RM`: a trained reward model over HTTP answers what the
in-process scoring (rewards.reward_model.RewardModelFn, `train rl --reward.model_name_or_path`) computes, with
OpenRLHF's request and answer JSON, its --normalize_reward and --max_len; concurrent requests share passes;
`train rl --reward.remote_url http://.../get_reward` runs against it as against the in-process model."""

import json
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch

from rlhfkit.cli.main import main
from rlhfkit.cli.serve_reward import build_app, served_reward_model
from rlhfkit.config.serve import ServeRewardConfig
from rlhfkit.errors import RewardError
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.reward import init_reward_model, load_reward_model
from rlhfkit.rewards.remote import RemoteRewardFn
from rlhfkit.rewards.reward_model import RewardModelFn
from tests.integration.conftest import rl_flags
from tests.unit.rewards.test_remote_reward import Server, free_port

MEAN, STD = 0.25, 2.0
QUERIES = ["1 plus 1: 2", "2 plus 2: 5 and then some more words to make it long", "x", "seven 7 7 7"]
PROMPTS = ["1 plus 1:", "2 plus 2:", "", "seven"]


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    """A reward model folder (the tiny model's backbone, a seeded head) with a stored mean and std."""
    root = tmp_path_factory.mktemp("served_rm")
    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(root / "tiny")
    tok.save_pretrained(root / "tiny")
    reward = init_reward_model(root / "tiny", tok.pad_token_id, torch.float32, seed=3)
    reward.config.mean, reward.config.std = MEAN, STD
    reward.save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    return root / "rm"


def serve(*argv):
    """A server of `rlhfkit serve-reward ARGV` on a free port (stop() it)."""
    app, _ = build_app(ServeRewardConfig.from_args([*map(str, argv), "--device", "cpu"]))
    return Server(app)


def post(server, queries, prompts=None, **fields):
    body = {"query": queries, "prompts": prompts or [""] * len(queries), "labels": [None] * len(queries), **fields}
    resp = httpx.post(server.url, json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


@pytest.mark.parametrize("normalize", [True, False])
def test_served_scores_are_the_in_process_scores(rm, normalize):
    local = RewardModelFn(rm, micro_batch_size=2, normalize=normalize)(QUERIES, PROMPTS, [None] * 4)
    server = serve("--reward.model_name_or_path", rm, "--reward.normalize_enable", normalize)
    try:
        out = post(server, QUERIES, PROMPTS)
        assert post(server, []) == {"rewards": [], "scores": [], "extra_logs": {}}
    finally:
        server.stop()
    assert set(out) == {"rewards", "scores", "extra_logs"}
    torch.testing.assert_close(torch.tensor(out["rewards"]), local.rewards, rtol=1e-5, atol=1e-6)
    assert out["scores"] == out["rewards"]
    raw = torch.tensor(out["extra_logs"]["rm_score"])
    torch.testing.assert_close(raw, local.extra_logs["rm_score"], rtol=1e-5, atol=1e-6)
    # normalised: (score - mean) / std with the config's mean and std; raw: the score itself
    expected = (raw - MEAN) / STD if normalize else raw
    torch.testing.assert_close(torch.tensor(out["rewards"]), expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose((raw - MEAN) / STD, raw)


@pytest.mark.parametrize("argv, dtype", [(["--param_dtype", "fp16"], torch.float16),
                                         (["--dtype", "bfloat16"], torch.bfloat16)])
def test_a_16_bit_server_scores_as_the_float32_model_within_its_rounding(rm, argv, dtype):
    local = RewardModelFn(rm)(QUERIES, PROMPTS, [None] * 4).extra_logs["rm_score"]
    fn = served_reward_model(ServeRewardConfig.from_args(["--reward_pretrain", str(rm), *argv, "--device", "cpu"]))
    assert next(fn.model.parameters()).dtype == dtype
    raw = fn(QUERIES, PROMPTS, [None] * 4).extra_logs["rm_score"]
    assert not torch.equal(raw, local)  # computed in 16 bits
    torch.testing.assert_close(raw, local, rtol=0.05, atol=0.05)


def test_max_len_scores_the_first_tokens_of_a_long_query(rm):
    """OpenRLHF's server cuts a query to its first --max_len tokens (the tokenizer's right truncation)."""
    model = load_reward_model(rm).eval().requires_grad_(False)
    tok = RewardModelFn(rm).tokenizer
    ids = tok(QUERIES[1], add_special_tokens=False)["input_ids"]
    assert len(ids) > 6
    with torch.no_grad():
        cut = float(model(input_ids=torch.tensor([ids[:6]])).logits[0, 0])
        whole = float(model(input_ids=torch.tensor([ids])).logits[0, 0])
    server = serve("--reward_pretrain", rm, "--max_len", 6)
    try:
        out = post(server, [QUERIES[1], QUERIES[2]])
    finally:
        server.stop()
    assert out["rewards"][0] == pytest.approx(cut, rel=1e-5, abs=1e-6)
    assert abs(cut - whole) > 1e-3
    short = float(model(input_ids=torch.tensor([tok(QUERIES[2], add_special_tokens=False)["input_ids"]])).logits[0, 0])
    assert out["rewards"][1] == pytest.approx(short, rel=1e-5, abs=1e-6)  # shorter than max_len: as it is


def test_a_left_truncating_tokenizer_keeps_the_last_tokens(rm):
    fn = RewardModelFn(rm, max_len=3)
    ids = fn.tokenizer(QUERIES[1], add_special_tokens=False)["input_ids"]
    assert fn.tokens(QUERIES[1]) == ids[:3]
    fn.tokenizer.truncation_side = "left"
    assert fn.tokens(QUERIES[1]) == ids[-3:]


def test_concurrent_requests_share_forward_passes_of_batch_size_queries(rm):
    """8 queries in 4 concurrent requests of 2 (the RL client's sharding): fewer passes than requests, each
    pass cut into forwards of --batch_size queries, and every request gets its own rows."""
    app_cfg = ServeRewardConfig.from_args(["--reward.model_name_or_path", str(rm), "--batch_size", "3",
                                           "--batch_window_ms", "300", "--device", "cpu"])
    app, _ = build_app(app_cfg)
    fn = app.state.reward_fn  # the PooledReward over the RewardModelFn
    sizes = []
    hook = fn.reward_fn.model.register_forward_pre_hook(lambda m, a, kw: sizes.append(kw["input_ids"].shape[0]),
                                                       with_kwargs=True)
    server = Server(app)
    queries = [f"{i} plus {i}: {2 * i}" for i in range(8)]
    try:
        out = RemoteRewardFn([server.url], batch_size=2, max_retries=0)(queries, [""] * 8, [None] * 8)
    finally:
        server.stop()
        hook.remove()
    local = RewardModelFn(rm, normalize=False)(queries, [""] * 8, [None] * 8)
    torch.testing.assert_close(out.rewards, local.rewards, rtol=1e-5, atol=1e-6)
    assert 1 <= fn.passes < 4
    assert max(sizes) == 3 and sum(sizes) == 8


def test_an_rl_step_against_the_server_is_the_in_process_reward_models_step(rm, tiny_ws, tmp_path):
    ws = tiny_ws("served_rl", rows=[{"q": f"{i} plus {i}:", "a": str(2 * i)} for i in range(4)])
    common = {"rollout.batch_size": 4, "rollout.n_samples_per_prompt": 2, "rollout.max_new_tokens": 5,
              "train.batch_size": 8, "train.micro_batch_size": 4, "train.max_steps": 1, "train.num_threads": 1}
    local = tmp_path / "local"
    in_process = {"reward.remote_url": None, "reward.model_name_or_path": rm}
    assert main(["train", "rl", *rl_flags(ws, local, **in_process, **common)]) == 0
    server = serve("--reward.model_name_or_path", rm, "--reward.normalize_enable")
    remote = tmp_path / "remote"
    try:
        assert main(["train", "rl", *rl_flags(ws, remote, **{"reward.remote_url": server.url}, **common)]) == 0
    finally:
        server.stop()
    a, b = (json.loads((d / "metrics.jsonl").read_text().splitlines()[0]) for d in (local, remote))
    assert a["reward"] == pytest.approx(b["reward"], rel=1e-5, abs=1e-6)
    assert a["reward_extra/rm_score"] == pytest.approx(b["reward_extra/rm_score"], rel=1e-5, abs=1e-6)
    assert a["reward"] == pytest.approx((a["reward_extra/rm_score"] - MEAN) / STD, rel=1e-4, abs=1e-5)


def test_the_cli_serves_a_reward_model_with_openrlhfs_flags(rm):
    port = free_port()
    cmd = [sys.executable, "-m", "rlhfkit.cli.main", "serve-reward", "--reward_pretrain", str(rm),
           "--normalize_reward", "--max_len", "2048", "--batch_size", "2", "--port", str(port), "--device", "cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/get_reward"
    try:
        for _ in range(600):
            try:
                out = RemoteRewardFn([url], max_retries=0)(QUERIES, PROMPTS, [None] * 4)
                break
            except RewardError:
                assert proc.poll() is None, proc.stdout.read().decode()
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)
    local = RewardModelFn(rm)(QUERIES, PROMPTS, [None] * 4)
    torch.testing.assert_close(out.rewards, local.rewards, rtol=1e-5, atol=1e-6)


def test_pooled_calls_get_their_own_rows_or_the_error():
    from rlhfkit.rewards.base import RewardOutput
    from rlhfkit.rewards.server import PooledReward

    seen = []

    def fn(queries, prompts, labels, **kw):
        seen.append(list(queries))
        if "boom" in queries:
            raise RewardError("boom")
        r = torch.tensor([float(q) for q in queries])
        return RewardOutput(r, r * 2, {"x": r + 1})

    pooled = PooledReward(fn, window_s=0.2)
    results = {}

    def call(name, qs):
        try:
            results[name] = pooled(qs, [""] * len(qs), [None] * len(qs))
        except RewardError as exc:
            results[name] = exc

    threads = [threading.Thread(target=call, args=(i, [str(i), str(10 + i)])) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1 and sorted(seen[0]) == sorted(["0", "10", "1", "11", "2", "12"])
    for i in range(3):
        assert results[i].rewards.tolist() == [i, 10 + i] and results[i].extra_logs["x"].tolist() == [i + 1, 11 + i]
        assert results[i].scores.tolist() == [2 * i, 20 + 2 * i]
    call("bad", ["boom"])
    assert isinstance(results["bad"], RewardError) and pooled.passes == 2


def test_eval_scores_samples_with_a_reward_model(rm, tiny_ws, tmp_path):
    """`rlhfkit eval --reward.model_name_or_path RM`: eval/reward is the mean of the reward model's scores of the
    samples, as train rl's reward would be."""
    rows = [{"q": f"{i} plus {i}:", "a": str(2 * i)} for i in range(3)]
    ws = tiny_ws("rm_eval", rows)
    out = tmp_path / "ev"
    argv = rl_flags(ws, out, **{"reward.remote_url": None, "reward.model_name_or_path": rm,
                                "eval.dataset": ws / "prompts.jsonl", "rollout.max_new_tokens": 4})
    assert main(["eval", *argv]) == 0
    metrics = json.loads((out / "eval.json").read_text())["metrics"]
    samples = [json.loads(x) for x in (out / "eval_samples.jsonl").read_text().splitlines()]
    local = RewardModelFn(rm)([s["prompt"] + s["response"] for s in samples], [s["prompt"] for s in samples],
                              [None] * len(samples))
    assert metrics["eval/reward"] == pytest.approx(float(local.rewards.mean()), rel=1e-5, abs=1e-6)
    assert metrics["eval/pass@1"] == pytest.approx(float((local.scores > 0.5).float().mean()))
