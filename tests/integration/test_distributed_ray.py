"""--distributed.backend ray on a real local Ray cluster (one per module) with the tiny model:
2 rollout workers + 1 trainer actor give bit for bit the single-process run; async training never
trains on samples staler than the bound, even with a slow worker, with multi-turn agents and with
dynamic filtering; a killed worker is replaced and its prompts re-issued without loss or
duplication."""

import collections
import copy
import json
import os

import pytest
import torch
from safetensors.torch import load_file

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

ray = pytest.importorskip("ray")

from rlhfkit.api.engines import build_pool  # noqa: E402 - after the Ray settings and importorskip
from rlhfkit.api.rl import RLTrainer  # noqa: E402 - after the Ray settings and importorskip
from rlhfkit.cli.main import main  # noqa: E402 - after the Ray settings and importorskip
from rlhfkit.config import RLConfig  # noqa: E402 - after the Ray settings and importorskip
from rlhfkit.data.prompts import load_prompts  # noqa: E402 - after the Ray settings and importorskip
from rlhfkit.distributed.launch import ray_temp_dir  # noqa: E402 - likewise
from tests.integration.conftest import rl_flags  # noqa: E402 - after the Ray settings and importorskip
from tests.unit.distributed.test_partial_rollout_worker import mixed_logprobs  # noqa: E402 - likewise

# wall-clock quantities differ between any two runs; the engine/trainer logprob gap measures float
# rounding (~1e-7), which differs between a worker's batch layout and the trainer's own engine
VOLATILE = ("time/", "rollout_tokens_per_s", "rollout/logprob_gap")


@pytest.fixture(scope="module")
def ws(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": str(i)} for i in range(24)]
    root = tiny_ws("ray", rows, sevens=True)
    (root / "agent.py").write_text(TWO_TURN_AGENT)
    return root


# two turns; each action earns its share of "7" characters
TWO_TURN_AGENT = """
from rlhfkit.agents import AgentInstanceBase


class AgentInstance(AgentInstanceBase):
    def __init__(self):
        self.turn = 0

    async def step(self, states, **kwargs):
        self.turn += 1
        share = sum(c == "7" for c in states["action_text"]) / 6.0
        done = self.turn >= 2
        return {"rewards": share, "scores": min(share, 1.0), "done": done,
                "environment_feedback": "" if done else "\\nagain:\\n"}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray.init(num_cpus=4, _temp_dir=ray_temp_dir(tmp_path_factory.mktemp("ray")), include_dashboard=False)
    yield
    ray.shutdown()


def flags(ws, out, **over):
    return rl_flags(ws, out, **{
        "rollout.batch_size": "4", "rollout.n_samples_per_prompt": "4", "rollout.max_new_tokens": "8",
        "train.batch_size": "16", "train.micro_batch_size": "8", "train.max_steps": "4", "train.num_threads": "1",
        "actor.adam.lr": "1e-2", "actor.lr_scheduler": "constant", **over})


def rows_of(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


@pytest.fixture(scope="module")
def local_run(ws):
    out = ws / "local"
    assert main(["train", "rl", *flags(ws, out)]) == 0
    return out


def test_sync_two_workers_and_trainer_actor_equal_single_process(ws, cluster, local_run):
    out = ws / "ray_sync"
    assert main(["train", "rl", *flags(ws, out, **{"distributed.backend": "ray", "rollout.num_workers": "2"})]) == 0
    a, b = load_file(local_run / "final" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = rows_of(local_run), rows_of(out)
    assert len(ra) == 4 and ra == rb
    assert all(r["staleness_max"] == 0 and r["stale_dropped"] == 0 for r in rb)


def in_process_trainer(ws, out, argv_over, delays=None):
    """The RLTrainer in this process over a RayEnginePool (`delays`: slot -> slow weight updates)."""
    cfg = RLConfig.from_args(flags(ws, out, **{"distributed.backend": "ray", "rollout.num_workers": "2",
                                               **argv_over}))
    d = cfg.data

    def load_examples(tok):
        return load_prompts(d.prompt_dataset, input_key=d.input_key, label_key=d.label_key, tokenizer=tok,
                            shuffle_seed=cfg.train.seed)

    trainer = RLTrainer.build(cfg, RLTrainer.validate(cfg), train_dataset=load_examples,
                              make_engine=lambda policy, tok: build_pool(cfg, policy, delays=delays))
    trained = []  # the prompt ids of every trajectory the trainer trains on
    loop, inner = trainer.loop, trainer.loop.experience
    lags = []  # per trained trajectory: the trainer's version minus each of its tokens' versions
    trajs_seen = []  # every trained trajectory
    loop.experience = lambda trajs, *args: (
        trained.extend(tuple(t.prompt_ids.tolist()) for t in trajs),
        trajs_seen.extend(trajs),
        lags.extend(loop.engine.version - (t.versions if t.versions is not None else torch.tensor([t.version]))
                    for t in trajs),
        inner(trajs, *args))[3]
    trainer.lags = lags
    trainer.trajs = trajs_seen
    return cfg, trainer, trainer.tracker, trained


def test_killed_worker_is_replaced_and_its_prompts_reissued(ws, cluster, local_run):
    cfg, trainer, tracker, trained = in_process_trainer(ws, ws / "ray_kill", {})
    killed, pool = [], trainer.engine
    submit = pool.submit

    def submit_then_kill(*args, **kwargs):  # step 3: worker 0 dies while its shard is in flight
        pending = submit(*args, **kwargs)
        if trainer.step == 2 and not killed:
            killed.append(pool.workers[0])
            ray.kill(pool.workers[0])
        return pending

    pool.submit = submit_then_kill
    trainer.loop.train()
    tracker.close()
    assert killed and trainer.engine.replaced == 1 and trainer.engine.workers[0] is not killed[0]
    assert trainer.step == 4
    # every prompt of the 4 batches trained once per sample: 16 prompts x 4 samples, none lost or doubled
    counts = collections.Counter(trained)
    assert len(trained) == 64 and set(counts.values()) == {4} and len(counts) == 16
    # per-prompt seeds: the re-issued prompts regenerate the same samples, so the weights are the
    # uninterrupted single-process run's, bit for bit
    ref = load_file(local_run / "final" / "model.safetensors")
    state = trainer.policy.state_dict()
    assert all(torch.equal(ref[k], state[k]) for k in ref)
    trainer.engine.shutdown()


def test_async_never_trains_staler_than_the_bound_with_a_slow_worker(ws, cluster):
    # worker 1 holds every weight update back 1.5 s (pool patience 2 s is not enough once they
    # queue up), so its shards come back more than 1 version old: dropped and re-issued.
    cfg, trainer, tracker, trained = in_process_trainer(
        ws, ws / "ray_async", {"train.async_enable": "true", "train.max_staleness": "1", "train.max_steps": "5"},
        delays={1: 1.5})
    trainer.engine.patience_s = 0.5
    seen = []  # the data position a checkpoint written by a callback would store
    trainer.loop.callbacks.append(lambda loop, step, m: seen.append((step, loop.state_dict()["data"]["index"])))
    history = trainer.loop.train()
    tracker.close()
    assert trainer.step == 5 and len(history) == 5
    assert all(h["staleness_max"] <= 1 for h in history)
    assert history[0]["staleness_max"] == 0  # the first batch is generated before any update
    assert any(h["staleness_max"] == 1 for h in history)  # later batches overlap training: 1 version old
    assert sum(h["stale_dropped"] for h in history) >= 1  # the slow worker's groups were dropped
    counts = collections.Counter(trained)
    assert len(trained) == 5 * 16 and set(counts.values()) == {4} and len(counts) == 20  # none lost or doubled
    # callbacks (checkpoints) see the position before the look-ahead batch: a resume regenerates it
    assert seen == [(k, 4 * k) for k in range(1, 6)]
    trainer.engine.shutdown()


def test_async_with_a_bound_of_two_trains_decoupled_and_reports_the_staleness_reached(ws, cluster):
    cfg, trainer, tracker, trained = in_process_trainer(
        ws, ws / "ray_async2", {"train.async_enable": "true", "train.max_staleness": "2", "train.max_steps": "4"},
        delays={1: 1.5})
    trainer.engine.patience_s = 0.5
    assert trainer.loop.update.losses.decoupled  # async is always decoupled
    history = trainer.loop.train()
    tracker.close()
    assert trainer.step == 4
    assert all(h["async/max_staleness"] == 2 and h["async/staleness_max"] <= 2 for h in history)
    assert max(h["async/staleness_max"] for h in history) >= 1
    # behaviour (the worker's logprobs, versions old) and proximal (the trainer's) kept apart
    assert all(h["rollout/logprob_gap_max"] >= 0 and h["rollout/behav_weight_mean"] > 0 for h in history)
    assert any(h["rollout/logprob_gap_max"] > 0 for h in history[1:])
    assert len(trained) == 4 * 16
    trainer.engine.shutdown()


def test_async_agents_with_a_bound_of_two_keep_it_for_every_token(ws, cluster):
    # multi-turn agents run ahead in the prefetch thread; a turn may straddle a weight update, so
    # each token carries its version and a sample's staleness is its oldest token's
    cfg, trainer, tracker, trained = in_process_trainer(
        ws, ws / "ray_async_agent", {"train.async_enable": "true", "train.max_staleness": "2",
                                     "train.max_steps": "4", "reward.remote_url": None,
                                     "agent.func_path": str(ws / "agent.py"), "agent.max_turns": "2",
                                     "agent.max_response_tokens": "40"},
        delays={1: 1.5})
    trainer.engine.patience_s = 0.5
    history = trainer.loop.train()
    tracker.close()
    assert trainer.step == 4 and len(trained) == 4 * 16
    assert all(h["async/staleness_max"] <= 2 for h in history)
    assert max(h["async/staleness_max"] for h in history) >= 1  # trained on samples generated ahead
    assert all(int(lag.max()) <= 2 for lag in trainer.lags)  # per token, not only per sample
    assert max(h["reward_extra/turns"] for h in history) > 1  # multi-turn episodes
    trainer.engine.shutdown()


def test_async_with_dynamic_filtering_tops_up_past_the_batch_ahead_and_keeps_the_bound(ws, cluster):
    # groups whose 4 samples all score 0 are dropped and topped up from the prompts past the
    # batch drawn ahead; no prompt is trained twice; the position recorded skips the top-ups
    cfg, trainer, tracker, trained = in_process_trainer(
        ws, ws / "ray_async_dyn", {"train.async_enable": "true", "train.max_staleness": "1", "train.max_steps": "3",
                                   "algo.dynamic_filtering_enable": "true",
                                   "algo.dynamic_filtering_max_rounds": "2", "rollout.temperature": "1.5"})
    seen = []
    trainer.loop.callbacks.append(lambda loop, step, m: seen.append(loop.state_dict()["data"]))
    history = trainer.loop.train()
    tracker.close()
    assert trainer.step == 3
    assert all(h["async/staleness_max"] <= 1 for h in history)
    assert sum(h["filtered_groups"] for h in history) >= 1 and max(h["dynamic_rounds"] for h in history) >= 2
    counts = collections.Counter(trained)
    assert set(counts.values()) == {4}  # every trained prompt once (its 4 samples), none twice
    for step, (h, state) in enumerate(zip(history, seen), start=1):
        topped = int(h["dynamic_rounds"] > 1)
        assert state["index"] >= 4 * step and (not topped or state["topups"] or step == 3)
    trainer.engine.shutdown()


def test_async_partial_rollouts_continue_across_weight_updates_with_per_token_versions(ws, cluster):
    # long generations decoded 2 tokens at a time: a weight sync that lands while batch k+1 is
    # generated is loaded between slices, so its samples mix two versions (oldest within the bound)
    cfg, trainer, tracker, trained = in_process_trainer(
        ws, ws / "ray_partial", {"train.async_enable": "true", "train.max_staleness": "1", "train.max_steps": "4",
                                 "train.partial_rollout_enable": "true", "train.partial_rollout_tokens": "2",
                                 "rollout.max_new_tokens": "48"})
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    sent, update = {}, trainer.engine.update_weights  # version -> the weights the pool sent the workers

    def recording(state, version, *args, **kwargs):
        sent[version] = {k: v.detach().clone() for k, v in (state or trainer.policy.state_dict()).items()}
        return update(state, version, *args, **kwargs)

    trainer.engine.update_weights = recording
    sent[trainer.engine.version] = before
    history = trainer.loop.train()
    tracker.close()
    assert trainer.step == 4 and len(trained) == 4 * 16
    assert all(h["async/staleness_max"] <= 1 for h in history)
    assert all(int(lag.max()) <= 1 for lag in trainer.lags)
    assert max(h["async/mixed_version_frac"] for h in history) > 0  # in-flight samples kept, not regenerated
    assert any(not torch.equal(before[k], v) for k, v in trainer.policy.state_dict().items())
    trainer.engine.shutdown()
    # the workers loaded the weights they were sent, not only the version: every token's logprob is the
    # one its version's weights give (over the KV cache earlier versions wrote), checked on mixed samples
    mixed = [t for t in trainer.trajs if len(set(t.versions.tolist())) > 1][:4]
    assert mixed
    models = {}
    for v in {int(x) for t in mixed for x in t.versions}:
        models[v] = copy.deepcopy(trainer.policy).eval()
        models[v].load_state_dict(sent[v])
    stale = {v: models[min(models)] for v in models}
    for t in mixed:
        want = mixed_logprobs(models, t.prompt_ids.tolist(), t.response_ids, t.versions)
        torch.testing.assert_close(t.logprobs, want, atol=1e-4, rtol=0)
        assert (mixed_logprobs(stale, t.prompt_ids.tolist(), t.response_ids, t.versions) - want).abs().max() > 1e-3


def test_an_error_in_the_trainer_actor_is_the_cli_one_line_error(ws, cluster, capsys):
    (ws / "reward_raises.py").write_text("def reward_func(queries, prompts, labels, **kw):\n    raise KeyError('x')\n")
    argv = flags(ws, ws / "ray_err", **{"distributed.backend": "ray", "reward.remote_url": str(ws / "reward_raises.py"),
                                        "train.max_steps": "1"})
    assert main(["train", "rl", *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "raised KeyError" in lines[0], err
    assert "Traceback" not in err


def test_lora_on_two_workers_equals_lora_in_one_process(ws, cluster):
    """The workers wrap their policy copy in the same LoRA adapters and receive only the adapter
    weights: the run equals the single-process LoRA run, metric for metric and weight for weight."""
    lora = {"ds.lora.rank": "4", "ds.lora.alpha": "8", "ds.lora.target_modules": "all-linear"}
    local, out = ws / "lora_local", ws / "lora_ray"
    assert main(["train", "rl", *flags(ws, local, **lora)]) == 0
    assert main(["train", "rl", *flags(ws, out, **lora, **{"distributed.backend": "ray",
                                                             "rollout.num_workers": "2"})]) == 0
    files = sorted(p.name for p in (local / "final").glob("*.safetensors"))
    assert files and files == sorted(p.name for p in (out / "final").glob("*.safetensors"))
    for name in files:
        a, b = load_file(local / "final" / name), load_file(out / "final" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = rows_of(local), rows_of(out)
    assert len(ra) == 4 and ra == rb
    assert rb[-1]["actor/grad_norm"] > 0


def test_qlora_on_two_workers_equals_qlora_in_one_process(ws, cluster):
    """--ds.load_in_4bit: each worker loads the same 4-bit NF4 base as the trainer (bitsandbytes quantizes
    the same files the same way) under the same adapters, and receives the adapter weights: the run equals
    the single-process QLoRA run, and the workers' logprobs are the trainer's forward on the 4-bit layers."""
    pytest.importorskip("bitsandbytes")
    qlora = {"ds.lora.rank": "4", "ds.lora.alpha": "8", "ds.load_in_4bit": "true", "train.max_steps": "3"}
    local, out = ws / "qlora_local", ws / "qlora_ray"
    assert main(["train", "rl", *flags(ws, local, **qlora)]) == 0
    assert main(["train", "rl", *flags(ws, out, **qlora, **{"distributed.backend": "ray",
                                                              "rollout.num_workers": "2"})]) == 0
    a, b = (load_file(p / "final" / "adapter_model.safetensors") for p in (local, out))
    assert a and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = rows_of(local), rows_of(out)
    assert len(ra) == 3 and ra == rb
    gaps = [r["rollout/logprob_gap_mean"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if "rollout/logprob_gap_mean" in r]
    assert len(gaps) == 3 and max(gaps) < 1e-4, gaps
