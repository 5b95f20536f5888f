"""Environment libraries through `rlhfkit train rl` on a tiny chat model: reasoning-gym's procedural prompts scored by
builtin:reasoning_gym, and SkyRL-Gym environments (a BaseTextEnv subclass from a file, the registered gsm8k), each
with the real library installed."""

import json
import re

import pytest

from rlhfkit.cli.main import main
from tests.integration.conftest import cli_flags, refuse
from tests.unit.agents.conftest import save_tiny_chat_model

SKYRL_ENV = '''
from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput


class Digits(BaseTextEnv):
    """0.1 for each digit of an action; two turns, "more digits" between them."""

    def __init__(self, env_config=None, extras={}):
        super().__init__()
        self.max_turns = int(extras["extra_info"]["max_turns"])

    def init(self, prompt):
        return [{"role": "system", "content": "Write digits."}, *prompt], {}

    def step(self, action):
        self.turns += 1
        done = self.turns >= self.max_turns
        obs = [] if done else [{"role": "user", "content": "more digits"}]
        reward = 0.1 * sum(c.isdigit() for c in action)
        return BaseTextEnvStepOutput(observations=obs, reward=reward, done=done, metadata={})
'''


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("envlibs")
    save_tiny_chat_model(root / "tiny")
    rows = [{"q": f"What is {k} + 1?", "reward_spec": {"method": "rule", "ground_truth": str(k + 1)},
             "extra_info": {"max_turns": 2}} for k in range(8)]
    (root / "skyrl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "skyrl_envs.py").write_text(SKYRL_ENV)
    return root


def flags(ws, out, **over):
    return ["train", "rl", *cli_flags({
        "actor.model_name_or_path": ws / "tiny", "data.apply_chat_template": "true", "rollout.batch_size": 2,
        "rollout.n_samples_per_prompt": 2, "rollout.max_new_tokens": 12, "train.batch_size": 4,
        "train.micro_batch_size": 4, "train.max_steps": 2, "actor.autocast": "none", "logger.progress_bar": "false",
        "logger.log_samples": 4, "data.prompt_max_len": 4096, "train.num_threads": 1, "ckpt.output_dir": out,
        **over})]


def trained(out):
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "reward" in m]
    assert len(steps) == 2 and (out / "final" / "model.safetensors").exists()
    return steps, samples


def test_reasoning_gym_prompts_scored_by_the_tasks_own_score_answer(ws, tmp_path):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (rlhfkit[reasoning-gym])")
    task = "reasoning_gym:leg_counting:size=8:seed=3:max_animals=3"
    assert main(flags(ws, tmp_path, **{"data.prompt_dataset": task, "data.input_key": "prompt",
                                       "data.label_key": "answer", "reward.remote_url": "builtin:reasoning_gym"})) == 0
    steps, samples = trained(tmp_path)
    assert all("reward_extra/answer_tag" in m for m in steps)
    for s in samples:
        assert "how many legs are there in total" in s["prompt"] and "<answer>answer here</answer>" in s["prompt"]
        # leg_counting's score_answer: the one answer tag's content must be the count (a tiny model never writes it)
        tags = re.findall(r"<answer>(.*?)</answer>", s["response"], re.DOTALL)
        right = s["response"].count("<answer>") == 1 and len(tags) == 1 and tags[0].strip() == s["label"]
        assert s["reward"] == float(right)


def test_an_unknown_reasoning_gym_task_is_one_line(ws, tmp_path, capsys):
    pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (rlhfkit[reasoning-gym])")
    refuse(flags(ws, tmp_path, **{"data.prompt_dataset": "reasoning_gym:leg_count", "data.input_key": "prompt",
                                  "reward.remote_url": "builtin:reasoning_gym"}), capsys,
           "reasoning-gym has no task 'leg_count'; similar: leg_counting")


def test_a_skyrl_base_text_env_from_a_file_trains_on_its_turns(ws, tmp_path):
    pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed (rlhfkit[skyrl])")
    env = f"{ws / 'skyrl_envs.py'}:Digits"
    assert main(flags(ws, tmp_path, **{"data.prompt_dataset": ws / "skyrl.jsonl", "data.input_key": "q",
                                       "agent.env": env, "agent.max_turns": 3,
                                       "agent.max_response_tokens": 600})) == 0
    _, samples = trained(tmp_path)
    for s in samples:
        msgs = s["messages"]
        assert msgs[0] == {"role": "system", "content": "Write digits."} and msgs[1]["content"].startswith("What is")
        actions = [m["content"] for m in msgs if m["role"] == "assistant"]
        assert [m["content"] for m in msgs[2:] if m["role"] == "user"] == ["more digits"] * (len(actions) - 1)
        assert len(actions) == 2 or s["finish_reason"] == "length"  # two turns unless the token budget ran out
        assert s["reward"] == pytest.approx(0.1 * sum(c.isdigit() for a in actions for c in a), abs=1e-6)


def test_skyrl_gsm8k_reads_the_rows_reward_spec(ws, tmp_path):
    pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed (rlhfkit[skyrl])")
    assert main(flags(ws, tmp_path, **{"data.prompt_dataset": ws / "skyrl.jsonl", "data.input_key": "q",
                                       "agent.env": "skyrl:gsm8k", "agent.max_response_tokens": 600})) == 0
    _, samples = trained(tmp_path)
    for s in samples:  # one step; 1 only for "#### N+1" (gsm8k's strict format), which a tiny model never writes
        (action,) = [m["content"] for m in s["messages"] if m["role"] == "assistant"]
        truth = str(int(re.search(r"What is (\d+)", s["messages"][0]["content"]).group(1)) + 1)
        hit = re.search(r"#### (\-?[0-9\.\,]+)", action)
        assert s["reward"] == float(hit is not None and hit.group(1).replace(",", "") == truth)


def test_an_openenv_server_trains_through_its_sessions(ws, tmp_path):
    pytest.importorskip("openenv.core", reason="openenv-core is not installed (rlhfkit[openenv])")
    from tests.unit.agents.openenv_server import guess_server

    rows = [{"q": "Play.", "seed": k} for k in range(8)]
    (tmp_path / "seeds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with guess_server(max_sessions=4) as url:  # rollout.batch_size x n_samples_per_prompt episodes at once
        run = flags(ws, tmp_path / "run", **{"data.prompt_dataset": tmp_path / "seeds.jsonl", "data.input_key": "q",
                                              "data.label_key": "seed", "agent.env": f"openenv:{url}",
                                              "agent.max_turns": 3, "agent.max_response_tokens": 600})
        assert main(run) == 0
    _, samples = trained(tmp_path / "run")
    for s in samples:  # the server's own game: 1 for saying the seed's digit within three tries
        msgs = s["messages"]
        assert msgs[0]["content"] == "Play.\n\nGuess my digit."
        # the environment gets the turn's text without special tokens
        said = [re.sub(r"<pad>|<unk>", "", m["content"]).strip() for m in msgs if m["role"] == "assistant"]
        heard = [m["content"] for m in msgs[1:] if m["role"] == "user"]
        assert heard == [f"not {a}" for a in said[:len(heard)]]  # each wrong try is answered by the server
        assert s["reward"] == float(str(int(s["label"]) % 10) in said)
