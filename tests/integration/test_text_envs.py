"""Text environments in RL through the CLI on a tiny model: a gymnasium-style class from a file
(always), GEM's and TextArena's real GuessTheNumber (where the library is installed); the
environment's reward combined with a reward function by --agent.env_reward_weight."""

import importlib.util
import json
import re

import pytest

from rlhfkit.cli.main import main
from tests.unit.agents.conftest import save_tiny_chat_model

ENV = '''
import re

class Guess:
    def reset(self, seed=None):
        self.target = (seed or 0) % 10
        return "Guess my digit."

    def step(self, action):
        hit = re.search(r"\\d", action)
        right = hit is not None and int(hit.group()) == self.target
        return ("yes" if right else "no"), float(right), right, False, {}
'''

SHORT = '''
def reward_func(queries, prompts, labels, **kwargs):
    return [1.0 if len(q) - len(p) < 40 else 0.0 for q, p in zip(queries, prompts)]
'''


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("textenvs")
    save_tiny_chat_model(root / "tiny")
    rows = [{"q": "Play.", "seed": k} for k in range(8)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "envs.py").write_text(ENV)
    (root / "short.py").write_text(SHORT)
    return root


def flags(ws, out, env, **over):
    f = {"actor.model_name_or_path": str(ws / "tiny"), "data.prompt_dataset": str(ws / "prompts.jsonl"),
         "data.input_key": "q", "data.apply_chat_template": "true", "agent.env": env, "agent.max_turns": "2",
         "agent.max_response_tokens": "600", "rollout.batch_size": "2", "rollout.n_samples_per_prompt": "2",
         "rollout.max_new_tokens": "12", "train.batch_size": "4", "train.micro_batch_size": "4",
         "train.max_steps": "2", "actor.autocast": "none", "logger.progress_bar": "false", "logger.log_samples": "4",
         "data.prompt_max_len": "4096", "ckpt.output_dir": str(out)}
    f.update(over)
    return ["train", "rl", *[x for k, v in f.items() if v is not None for x in (f"--{k}", v)]]


def trained(out):
    ms = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len([m for m in ms if "reward" in m]) == 2 and (out / "final" / "model.safetensors").exists()
    return [m for m in ms if "reward" in m], samples


def test_a_gymnasium_style_class_from_a_file(ws, tmp_path):
    assert main(flags(ws, tmp_path, f"{ws / 'envs.py'}:Guess")) == 0
    steps, samples = trained(tmp_path)
    for s in samples:
        assert s["messages"][0]["content"] == "Play.\n\nGuess my digit."
        # each turn that is not right gets the environment's answer as a user turn
        assert all(m["content"] == "no" for m in s["messages"][2::2] if m["role"] == "user")
        assert s["reward"] in (0.0, 1.0)


def test_environment_and_function_rewards_combine_with_a_weight(ws, tmp_path):
    base = flags(ws, tmp_path / "refused", f"{ws / 'envs.py'}:Guess", **{"reward.remote_url": str(ws / "short.py")})
    assert main(base) == 2  # both rewards and no weight: refused in one line
    run = flags(ws, tmp_path / "run", f"{ws / 'envs.py'}:Guess",
                **{"reward.remote_url": str(ws / "short.py"), "agent.env_reward_weight": "0.5",
                   "data.label_key": "seed"})
    assert main(run) == 0
    steps, samples = trained(tmp_path / "run")
    assert all("reward_extra/env_reward" in m for m in steps)
    for s in samples:  # reward = the function's (a short response) + 0.5 x the environment's (a right guess)
        guesses = [re.search(r"\d", m["content"]) for m in s["messages"] if m["role"] == "assistant"]
        right = any(g is not None and int(g.group()) == int(s["label"]) % 10 for g in guesses)
        assert s["reward"] == pytest.approx(float(len(s["response"]) < 40) + 0.5 * right)


@pytest.mark.skipif(importlib.util.find_spec("gem") is None, reason="gem-llm is not installed (rlhfkit[gem])")
def test_gem_guess_the_number(ws, tmp_path):
    assert main(flags(ws, tmp_path, "gem:game:GuessTheNumber-v0-easy")) == 0
    _, samples = trained(tmp_path)
    first = samples[0]["messages"][0]["content"]
    assert first.startswith("Play.\n\nYou are playing Guess The Number.")


@pytest.mark.skipif(importlib.util.find_spec("textarena") is None, reason="textarena is not installed")
def test_textarena_guess_the_number(ws, tmp_path):
    assert main(flags(ws, tmp_path, "textarena:GuessTheNumber-v0")) == 0
    _, samples = trained(tmp_path)
    assert "You are playing Guess The Number" in samples[0]["messages"][0]["content"]
