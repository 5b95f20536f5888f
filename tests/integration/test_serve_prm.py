"""`rlhfkit serve-reward` of a process reward model (`train prm` folder): it answers each query's step scores
("step_rewards", "step_ends") beside one aggregate in "rewards", and `train rl --reward.remote_url` against it
puts the steps on the policy's tokens as the in-process PRM does: the same token rewards, advantages and
update. Bad inputs (another vocabulary, malformed answers, a group estimator) are one-line errors."""

import json

import httpx
import pytest
import torch
from safetensors.torch import load_file

from rlhfkit.cli.main import main
from rlhfkit.cli.serve_reward import build_app
from rlhfkit.config.serve import ServeRewardConfig
from rlhfkit.data.types import PromptItem, Trajectory
from rlhfkit.errors import ConfigError, RewardError
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.reward import mark_prm
from rlhfkit.rewards.remote import RemoteRewardFn
from rlhfkit.rewards.reward_model import ProcessRewardFn, vocabulary_fingerprint
from rlhfkit.trainers.rl.scoring import Scorer
from tests.integration.conftest import rl_flags
from tests.unit.rewards.test_remote_reward import Server


@pytest.fixture(scope="module")
def prms(tmp_path_factory):
    """{placeholder: a PRM folder}: the tiny model's architecture and tokenizer (the policy's vocabulary) with
    other random weights, recorded as a PRM with a one-token ("#") and a two-token ("#%") placeholder."""
    root = tmp_path_factory.mktemp("served_prm")
    out = {}
    for name, placeholder in (("one", "#"), ("two", "#%")):
        model, tok = tiny_model_and_tokenizer(seed=1)
        mark_prm(model, placeholder, ("+", "-"))
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[placeholder] = root / name
    return out


def serve(*argv):
    app, what = build_app(ServeRewardConfig.from_args([*map(str, argv), "--device", "cpu"]))
    assert what.startswith("process reward model")
    return Server(app)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def trajectories(tok):
    """Prompts and responses with several steps, a step ended by a placeholder the policy wrote, a response
    without any step (EOS alone) and one of a single step."""
    eos = tok.eos_token_id
    rows = [("1+1=", ids(tok, "2\n2*3=7\n") + [eos]), ("q:", ids(tok, "ab#%") + ids(tok, "\ncd")),
            ("x", [eos]), ("2+2=", ids(tok, "4"))]
    prompts = [PromptItem(p, ids(tok, p)) for p, _ in rows]
    trajs = [Trajectory(torch.tensor(ids(tok, p)), torch.tensor(r), torch.ones(len(r), dtype=torch.bool),
                        torch.zeros(len(r)), "stop", i) for i, (p, r) in enumerate(rows)]
    return prompts, trajs


@pytest.mark.parametrize("placeholder", ["#", "#%"])
def test_the_served_steps_land_where_the_in_process_ones_do(prms, placeholder):
    local = ProcessRewardFn(prms[placeholder])
    tok = local.tokenizer
    prompts, trajs = trajectories(tok)
    want = Scorer(local, tok, max_len=16, step_rewards=True)(prompts, trajs)
    server = serve("--reward.model_name_or_path", prms[placeholder])
    try:
        remote = RemoteRewardFn([server.url]).with_vocab(vocabulary_fingerprint(tok))
        got = Scorer(remote, tok, max_len=16, step_rewards=True)(prompts, trajs)
    finally:
        server.stop()
    assert want.token_rewards.shape == got.token_rewards.shape == (4, 9)
    torch.testing.assert_close(got.token_rewards, want.token_rewards, rtol=1e-6, atol=1e-7)
    assert [r.nonzero().flatten().tolist() for r in got.token_rewards] == \
        [r.nonzero().flatten().tolist() for r in want.token_rewards]
    assert got.rewards.tolist() == want.rewards.tolist() == [0.0] * 4  # the rewards are per step
    torch.testing.assert_close(got.scores, want.scores)  # the weakest step (0 for the response without one)
    assert got.scores[2] == 0.0 and got.token_rewards[2].count_nonzero() == 0
    assert got.metrics.keys() == want.metrics.keys()
    # steps: "2\n", "2*3=7\n"; "ab#" (with "#": "%\n" too), "cd"; none; "4"
    steps = {"#": 2 + 3 + 0 + 1, "#%": 2 + 2 + 0 + 1}[placeholder]
    assert got.metrics["reward_extra/prm_steps"] == want.metrics["reward_extra/prm_steps"] == steps / 4


def test_the_answer_holds_the_steps_and_their_aggregate(prms):
    """An OpenRLHF-style request (text alone) reads "rewards": the --reward.prm_aggregate of "step_rewards"."""
    tok = ProcessRewardFn(prms["#"]).tokenizer
    body = {"query": ["1+1=2\n2*3=7", "q:ab", "x"], "prompts": ["1+1=", "q:", "x"], "labels": [None] * 3}
    answers = {}
    for rule in ("min", "prod", "mean", "last"):
        server = serve("--reward.model_name_or_path", prms["#"], "--reward.prm_aggregate", rule)
        try:
            answers[rule] = httpx.post(server.url, json=body, timeout=60).json()
        finally:
            server.stop()
    steps = answers["min"]["step_rewards"]
    assert [len(s) for s in steps] == [2, 1, 0]  # "2\n2*3=7": two steps; "" (query == prompt): none
    assert answers["min"]["step_ends"] == [[1, 6], [1], []]  # in the PRM's tokens of "2\n2*3=7" and "ab"
    assert all(a["step_rewards"] == steps for a in answers.values())
    (p, q), (r,) = steps[0], steps[1]
    by_hand = {"min": [min(p, q), r, 0.0], "prod": [p * q, r, 0.0], "mean": [(p + q) / 2, r, 0.0],
               "last": [q, r, 0.0]}
    for rule, want in by_hand.items():
        assert answers[rule]["rewards"] == pytest.approx(want, rel=1e-6) and answers[rule]["scores"] == \
            answers[rule]["rewards"]
    assert answers["min"]["extra_logs"]["prm_step_mean"][2] is None  # no step: not applicable
    assert p != q and 0 < p < 1 and 0 < q < 1  # so the four rules give four values
    assert [tok.decode([i]) for i in ids(tok, "2\n2*3=7")] == ["2", "\n", "2", "*", "3", "=", "7"]


def rl_common(ws, out, **over):
    flags = {"rollout.batch_size": 4, "rollout.n_samples_per_prompt": 2, "rollout.max_new_tokens": 8,
             "train.batch_size": 8, "train.micro_batch_size": 4, "train.max_steps": 2, "train.num_threads": 1,
             "algo.advantage.estimator": "reinforce", "actor.adam.lr": 1e-3, "reward.remote_url": None, **over}
    return ["train", "rl", *rl_flags(ws, out, **flags)]


def test_an_rl_run_over_http_is_the_in_process_prm_run(prms, tiny_ws, tmp_path):
    """The same token rewards, advantages and update: the same metrics step by step and the same weights."""
    ws = tiny_ws("served_prm_rl", rows=[{"q": f"{i}+{i}=", "a": str(2 * i)} for i in range(8)])
    prm = prms["#%"]
    local, remote = tmp_path / "local", tmp_path / "remote"
    assert main(rl_common(ws, local, **{"reward.model_name_or_path": prm})) == 0
    server = serve("--reward.model_name_or_path", prm, "--batch_size", 4)  # the in-process micro-batches
    try:
        assert main(rl_common(ws, remote, **{"reward.remote_url": server.url})) == 0
        grpo = tmp_path / "grpo"  # a group baseline takes one reward per sample: the server's aggregate (min)
        assert main(rl_common(ws, grpo, **{"reward.remote_url": server.url,
                                           "algo.advantage.estimator": "group_norm"})) == 0
    finally:
        server.stop()
    for m in (json.loads(x) for x in (grpo / "metrics.jsonl").read_text().splitlines()):
        assert m["reward"] == pytest.approx(m["reward_extra/prm_step_min"]) and m["reward"] > 0
    a, b = ([json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (local, remote))
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert x["reward_extra/prm_steps"] > 0 and x["reward"] == y["reward"] == 0.0 and x["advantage_abs"] > 0
        same = [k for k in x if not k.startswith("time/") and k != "rollout_tokens_per_s"]
        assert {"advantage_abs", "policy_loss", "actor/grad_norm", "score", "reward_extra/prm_step_min"} <= set(same)
        assert set(same) <= set(y)
        for key in same:
            assert y[key] == pytest.approx(x[key], rel=1e-5, abs=1e-6), key
    before = load_file(ws / "tiny" / "model.safetensors")
    w_local, w_remote = (load_file(d / "final" / "model.safetensors") for d in (local, remote))
    assert any(not torch.equal(before[k], w_local[k]) for k in before)  # it trained
    assert all(torch.equal(w_remote[k], w_local[k]) for k in w_local)  # bit for bit


def test_another_vocabulary_and_bad_token_ids_are_refused(prms):
    tok = ProcessRewardFn(prms["#"]).tokenizer
    server = serve("--reward.model_name_or_path", prms["#"])
    try:
        call = (["q:ab"], ["q:"], [None])
        kwargs = {"prompt_ids": [ids(tok, "q:")], "completion_ids": [ids(tok, "ab")]}
        with pytest.raises(RewardError, match="HTTP 422: the request's token ids are of vocabulary 'other'.*the "
                                              "policy must have the PRM's tokenizer") as e:
            RemoteRewardFn([server.url], max_retries=0).with_vocab("other")(*call, **kwargs)
        assert "\n" not in str(e.value)
        body = {"query": ["q:ab"], "prompt_ids": [[0]], "response_ids": [[10 ** 6]],
                "vocab": vocabulary_fingerprint(tok)}
        resp = httpx.post(server.url, json=body, timeout=60)
        assert resp.status_code == 422 and "response_ids must be 1 lists of token ids in [0, " in resp.text
        # without "vocab" the server tokenizes the text; the client then keeps no step ends
        out = RemoteRewardFn([server.url])(*call, **kwargs)
        assert [s.numel() for s in out.steps] == [1] and out.step_ends is None
    finally:
        server.stop()


def test_a_process_reward_model_is_not_normalised():
    with pytest.raises(ConfigError, match="--reward.prm_aggregate: unknown value 'max'"):
        ServeRewardConfig.from_args(["--reward.model_name_or_path", "x", "--reward.prm_aggregate", "max"])


def test_normalize_is_refused_for_a_prm(prms):
    with pytest.raises(ConfigError, match="is a process reward model, whose scores are probabilities"):
        build_app(ServeRewardConfig.from_args(["--reward.model_name_or_path", str(prms["#"]),
                                               "--reward.normalize_enable", "--device", "cpu"]))
