"""Multi-turn agent RL on the tiny model: the reward of a two-turn environment rises, feedback
tokens never count in the loss, and OpenRLHF-style agent files (both contracts) and built-in
environments run through the CLI."""

import json
from pathlib import Path

import pytest

from rlhfkit.api.rl import RLTrainer
from rlhfkit.cli import train_rl
from rlhfkit.cli.main import main
from rlhfkit.config import RLConfig
from rlhfkit.data.prompts import load_prompts
from tests.integration.conftest import rl_flags

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "openrlhf_style_agent.py"
FIXTURE_2025 = Path(__file__).resolve().parents[1] / "fixtures" / "openrlhf_2025_agent.py"

# Two turns; each action earns its share of "7" characters (dense, learnable by a tiny model).
SEVENS_AGENT = '''
from rlhfkit.agents import AgentInstanceBase


class AgentInstance(AgentInstanceBase):
    def __init__(self):
        self.turn = 0

    async def step(self, states, **kwargs):
        self.turn += 1
        action = states["action_text"]
        share = sum(c == "7" for c in action) / 6.0
        done = self.turn >= 2
        return {"rewards": share, "scores": min(share, 1.0), "done": done,
                "environment_feedback": "" if done else "\\nagain:\\n", "extra_logs": {"share": share}}
'''


@pytest.fixture(scope="module")
def ws(tiny_ws):
    rows = [{"q": f"x{i % 10}y{i // 10}:", "a": "7"} for i in range(64)]
    root = tiny_ws("agent", rows)
    (root / "sevens.py").write_text(SEVENS_AGENT)
    return root


def flags(ws, out, **over):
    return rl_flags(ws, out, **{
        "reward.remote_url": None, "agent.func_path": ws / "sevens.py", "agent.max_turns": "3",
        "rollout.batch_size": "8", "rollout.n_samples_per_prompt": "4", "rollout.max_new_tokens": "6",
        "train.batch_size": "32", "train.micro_batch_size": "16", "train.max_steps": "14", "train.num_episodes": "3",
        "actor.adam.lr": "1e-2", "actor.lr_scheduler": "constant", **over})


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_multi_turn_agent_training_raises_reward(ws, tmp_path):
    cfg = RLConfig.from_args(flags(ws, tmp_path, **{"train.max_steps": "8"}))
    seen = []
    trainer = RLTrainer.from_config(
        cfg, train_dataset=lambda tok: load_prompts(str(ws / "prompts.jsonl"), input_key="q", label_key="a"))
    source = trainer.loop.source
    generate = source.generate

    def spy(batch, upcoming=None):
        trajs = generate(batch, upcoming)
        seen.extend(trajs)
        return trajs

    source.generate = spy
    history = trainer.loop.train()
    trainer.tracker.close()
    rewards = [m["reward"] for m in history]
    assert len(rewards) == 8
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 1.0, f"reward {first:.3f} -> {last:.3f}"  # measured 0.02 -> 1.57 (max 2)
    assert all(m["reward_extra/turns"] == 2.0 for m in history)  # every episode took both turns
    # feedback tokens are in the trajectories but never in the loss
    fb = trainer.tokenizer("\nagain:\n", add_special_tokens=False)["input_ids"]
    for t in seen:
        r, m = t.response_ids.tolist(), t.loss_mask.tolist()
        starts = [i for i in range(len(r)) if r[i : i + len(fb)] == fb]
        assert len(starts) == 1 and not any(m[starts[0] : starts[0] + len(fb)])
        assert sum(m) == len(r) - len(fb)
    assert all("drift_frac" in m for m in history)


def test_openrlhf_agent_file_through_the_cli_alias(ws, tmp_path):
    argv = flags(ws, tmp_path, **{"train.max_steps": "2"})
    i = argv.index("--agent.func_path")
    argv[i : i + 2] = ["--train.agent_func_path", str(FIXTURE)]
    assert train_rl.run(argv) == 0
    ms = metrics(tmp_path)
    assert len([m for m in ms if "reward" in m]) == 2 and (tmp_path / "final" / "model.safetensors").exists()
    assert all(1.0 <= m["reward_extra/tries"] <= 2.0 for m in ms if "reward" in m)


def test_openrlhf_2025_agent_file_trains_through_the_cli(ws, tmp_path):
    """`class AgentExecutor(AgentExecutorBase)` whose execute() calls the engine twice, writes its
    own feedback and computes its own reward: it trains, its reward is what gets logged, and it rises."""
    argv = flags(ws, tmp_path, **{"agent.func_path": str(FIXTURE_2025), "train.max_steps": "8",
                                  "agent.max_response_tokens": "40"})  # 2 actions of 6 + its feedback
    assert main(["train", "rl", *argv]) == 0
    ms = [m for m in metrics(tmp_path) if "reward" in m]
    assert len(ms) == 8 and (tmp_path / "final" / "model.safetensors").exists()
    for m in ms:
        assert m["reward_extra/turns"] == 2.0  # both engine calls are actions
        expected = (m["reward_extra/second_sevens"] + 0.5 * m["reward_extra/first_sevens"]) / 6
        assert m["reward"] == pytest.approx(expected, abs=1e-5)
    rewards = [m["reward"] for m in ms]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.5, f"reward {first:.3f} -> {last:.3f}"  # measured 0.022 -> 1.245 (max 1.5)


RETOKENIZING_2025 = FIXTURE_2025.read_text().replace(  # the actions' text re-tokenized (and reversed)
    "action = list(final.outputs[0].token_ids)",
    "action = self.hf_tokenizer(final.outputs[0].text, add_special_tokens=False)['input_ids'][::-1]").replace(
    "log_probs += [lp[t].logprob for t, lp in zip(action, final.outputs[0].logprobs)]",
    "log_probs += [0.0] * len(action)")


def test_a_2025_file_that_trains_on_other_tokens_than_generated_is_refused_in_one_line(ws, tmp_path, capsys):
    bad = tmp_path / "retokenizing.py"
    bad.write_text(RETOKENIZING_2025)
    argv = flags(ws, tmp_path / "run", **{"agent.func_path": str(bad), "train.max_steps": "1",
                                          "agent.max_response_tokens": "40"})
    assert main(["train", "rl", *argv]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert f"agent {bad}: action range (" in lines[0] and "the engine did not generate" in lines[0]


def guesses(context: str) -> str:  # a low guess, then the secret (7) once told "higher"
    return "7" if context.endswith("higher\n") else "3"


def calculates(context: str) -> str:  # the tool, then the tool's result as the answer
    if context.endswith("</result>\n"):
        return f"<answer>{context.rsplit('<result>', 1)[1].split('</result>')[0]}</answer>"
    return "<calc>3+4</calc>"


# guess: solved on the second turn, 1 - 0.2 * (2 - 1); calculator: the right answer after one call
@pytest.mark.parametrize("name,policy,reward", [("builtin:guess", guesses, 0.8),
                                                ("builtin:calculator", calculates, 1.0)], ids=["guess", "calculator"])
def test_builtin_environments_run(ws, tmp_path, name, policy, reward):
    """A scripted policy through the real loop and the environment: the reward is the environment's."""
    from tests.unit.agents.conftest import ScriptedEngine

    cfg = RLConfig.from_args(flags(ws, tmp_path, **{"agent.func_path": name, "train.max_steps": "1",
                                                    "rollout.max_new_tokens": "24"}))
    trainer = RLTrainer.from_config(cfg, make_engine=lambda policy_model, tok: ScriptedEngine(tok, policy))
    trainer.train()
    [m] = [m for m in metrics(tmp_path) if "reward" in m]
    assert m["reward"] == pytest.approx(reward) and m["reward_extra/turns"] == 2
