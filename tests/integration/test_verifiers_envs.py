"""A verifiers environment (Prime Intellect's `verifiers`, a SingleTurnEnv with a two-function rubric,
built here from a small in-memory dataset) trains the tiny model through rlhfkit's endpoint: loaded by
name through `rlhfkit train rl --agent.func_path verifiers:ENV_ID` on its own dataset, and given as an
object to `RLTrainer.from_config(cfg, agent=env)` on the user's prompts, and scored by `rlhfkit eval`; a
MultiTurnEnv's episodes are one trajectory each, its feedback masked.
The reward is the rubric's weighted sum, recomputed here from the recorded replies; its functions'
scores are logged."""

import json
import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
vf = pytest.importorskip("verifiers")
pytest.importorskip("openai")

from rlhfkit.api.rl import RLTrainer  # noqa: E402
from rlhfkit.cli.main import main  # noqa: E402
from rlhfkit.config import RLConfig  # noqa: E402

# the environment module vf.load_environment("sevens-env") imports (a packaged verifiers environment
# is such a module, installed)
ENV_MODULE = '''
import verifiers as vf
from datasets import Dataset


def reply_text(completion):
    last = completion[-1] if completion else None
    content = getattr(last, "content", None) if not isinstance(last, dict) else last.get("content")
    return content if isinstance(content, str) else ""


def sevens(completion, answer, **kwargs):
    """The share of the reply's characters that are the answer's digit, out of 8."""
    return reply_text(completion).count(answer) / 8.0


def short(completion, **kwargs):
    return float(len(reply_text(completion)) < 4)


def load_environment(n: int = 16):
    data = Dataset.from_list([{"question": f"x{i % 10}y{i // 10}", "answer": "7"} for i in range(n)])
    return vf.SingleTurnEnv(dataset=data, system_prompt="digits", rubric=vf.Rubric(funcs=[sevens, short],
                                                                                   weights=[1.0, 0.5]))
'''
WEIGHTS = {"sevens": 1.0, "short": 0.5}


class AgainEnv(vf.MultiTurnEnv):
    """Two model turns; between them the environment answers "again"."""

    async def env_response(self, messages, state, **kwargs):
        return [{"role": "user", "content": "again"}]


def last_reply_sevens(completion, answer, **kwargs):
    last = completion[-1] if completion else None
    content = getattr(last, "content", None) if not isinstance(last, dict) else last.get("content")
    return (content or "").count(answer) / 8.0 if isinstance(content, str) else 0.0


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("verifiers", [{"q": f"a{i}b", "a": "7"} for i in range(8)])
    (root / "sevens_env.py").write_text(ENV_MODULE)
    return root


@pytest.fixture
def env_module(ws, monkeypatch):
    monkeypatch.syspath_prepend(str(ws))
    yield
    sys.modules.pop("sevens_env", None)


def flags(ws, out, **over):
    f = {"actor.model_name_or_path": str(ws / "tiny"), "agent.func_path": "verifiers:sevens-env",
         "data.apply_chat_template": "true", "rollout.batch_size": "4", "rollout.n_samples_per_prompt": "2",
         "rollout.max_new_tokens": "6", "train.batch_size": "8", "train.micro_batch_size": "8",
         "train.max_steps": "2", "actor.autocast": "none", "logger.progress_bar": "false",
         "train.num_threads": "1", "ckpt.output_dir": str(out)}
    f.update(over)
    return [x for k, v in f.items() if v is not None for x in (f"--{k}", v)]


def metrics(out):
    return [m for m in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "reward" in m]


def spy_on_trajectories(trainer) -> list:
    seen, generate = [], trainer.loop.source.generate

    def spy(batch, upcoming=None):
        trajs = generate(batch, upcoming)
        seen.extend(trajs)
        return trajs

    trainer.loop.source.generate = spy
    return seen


def test_a_verifiers_environment_by_name_trains_through_the_cli_on_its_own_dataset(ws, tmp_path, env_module):
    assert main(["train", "rl", *flags(ws, tmp_path)]) == 0
    ms = metrics(tmp_path)
    assert len(ms) == 2 and (tmp_path / "final" / "model.safetensors").exists()
    for m in ms:  # 4 prompts x 2 rollouts, one call each; the reward is the rubric's weighted sum
        assert m["agent/episodes"] == 8 and m["endpoint/calls"] == 8
        assert m["reward"] == pytest.approx(sum(w * m[f"reward_extra/{k}"] for k, w in WEIGHTS.items()), abs=1e-5)
        assert 0 <= m["reward_extra/sevens"] <= 6 / 8 and "reward_extra/vf_error" in m


def test_a_verifiers_environment_object_trains_from_python_on_the_users_prompts(ws, tmp_path, env_module):
    import sevens_env

    env = sevens_env.load_environment()
    argv = flags(ws, tmp_path, **{"agent.func_path": None, "data.apply_chat_template": None,
                                  "data.prompt_dataset": str(ws / "prompts.jsonl"), "data.input_key": "q",
                                  "data.label_key": "a"})
    trainer = RLTrainer.from_config(RLConfig.from_args(argv), agent=env)
    seen = spy_on_trajectories(trainer)
    trainer.train()
    assert len(metrics(tmp_path)) == 2 and len(seen) == 16
    tok = trainer.tokenizer
    for t in seen:  # the rubric scored the reply the endpoint recorded (the trained tokens)
        reply = tok.decode(t.response_ids.tolist(), skip_special_tokens=True)
        expected = reply.count("7") / 8.0 + 0.5 * float(len(reply) < 4)
        assert t.info["agent_reward"] == pytest.approx(expected, abs=1e-6), reply
        assert t.info["extra_logs"]["sevens"] == pytest.approx(reply.count("7") / 8.0, abs=1e-6)
    prompts = {tok.decode(t.prompt_ids.tolist()) for t in seen}
    assert all("digits" in p for p in prompts) and any("a3b" in p for p in prompts)  # system prompt + user's prompt


def test_rlhfkit_eval_scores_a_verifiers_environment_on_held_out_prompts(ws, tmp_path, env_module):
    argv = flags(ws, tmp_path, **{"data.apply_chat_template": None, "eval.dataset": str(ws / "prompts.jsonl"),
                                  "data.input_key": "q", "data.label_key": "a", "eval.max_samples": "4",
                                  "eval.n_samples": "2", "eval.temperature": "1.0"})
    assert main(["eval", *argv]) == 0
    out = json.loads((tmp_path / "eval.json").read_text())["metrics"]
    rows = [json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and out["eval/dropped"] == 0
    assert out["eval/reward"] == pytest.approx(out["eval/sevens"] + 0.5 * out["eval/short"], abs=1e-6)
    for r in rows:  # each episode's reward: the rubric's weighted sum of its functions' scores
        assert r["reward"] == pytest.approx(r["extra_logs"]["sevens"] + 0.5 * r["extra_logs"]["short"], abs=1e-6)


def test_a_multi_turn_verifiers_environment_is_one_trajectory_per_episode_with_its_feedback_masked(ws, tmp_path):
    from datasets import Dataset

    data = Dataset.from_list([{"question": f"x{i}y", "answer": "7"} for i in range(8)])
    env = AgainEnv(dataset=data, max_turns=2, rubric=vf.Rubric(funcs=[last_reply_sevens]))
    argv = flags(ws, tmp_path, **{"agent.func_path": None, "agent.max_turns": "2",
                                  "agent.max_response_tokens": "40"})
    trainer = RLTrainer.from_config(RLConfig.from_args(argv), agent=env)
    seen = spy_on_trajectories(trainer)
    trainer.train()
    ms = metrics(tmp_path)
    assert len(ms) == 2 and all(m["endpoint/splits"] == 0 for m in ms) and len(seen) == 16
    # two calls an episode (one where verifiers ended the rollout on an empty first reply)
    assert sum(m["endpoint/calls"] for m in ms) == sum(t.info["turns"] for t in seen) > 24
    tok = trainer.tokenizer
    for t in (t for t in seen if t.info["turns"] == 2):  # the second call continued the first: one trajectory,
        masked = tok.decode(t.response_ids[~t.loss_mask].tolist())  # the environment's "again" in it, masked
        assert "again" in masked and "again" not in tok.decode(t.response_ids[t.loss_mask].tolist())
