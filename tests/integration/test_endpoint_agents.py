"""Agents written against the OpenAI API train through rlhfkit's endpoint on the tiny model: an
`openai`-SDK agent file through `rlhfkit train rl --agent.func_path` (its reward rises, every
episode is one trajectory with the agent's feedback masked), and an agent function through the
Python API (RLTrainer.from_config(cfg, agent=fn)) with the reward left to the reward function."""

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("openai")

from rlhfkit.api.rl import RLTrainer  # noqa: E402
from rlhfkit.cli.main import main  # noqa: E402
from rlhfkit.config import RLConfig  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def ws(tiny_ws):
    return tiny_ws("endpoint", [{"q": f"x{i % 10}y{i // 10}", "a": "7"} for i in range(64)], sevens=True)


def flags(ws, out, **over):
    f = {"actor.model_name_or_path": str(ws / "tiny"), "data.prompt_dataset": str(ws / "prompts.jsonl"),
         "data.input_key": "q", "data.label_key": "a", "agent.func_path": str(FIXTURES / "openai_sdk_agent.py"),
         "agent.max_turns": "2", "rollout.batch_size": "8", "rollout.n_samples_per_prompt": "4",
         "rollout.max_new_tokens": "6", "agent.max_response_tokens": "60", "train.batch_size": "32",
         "train.micro_batch_size": "16", "train.max_steps": "10", "train.num_episodes": "3",
         "actor.adam.lr": "1e-2", "actor.lr_scheduler": "constant", "actor.autocast": "none",
         "logger.progress_bar": "false", "train.num_threads": "1", "ckpt.output_dir": str(out)}
    f.update(over)
    return [x for k, v in f.items() for x in (f"--{k}", v)]


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_an_openai_sdk_agent_file_trains_through_the_cli_and_its_reward_rises(ws, tmp_path):
    assert main(["train", "rl", *flags(ws, tmp_path)]) == 0
    ms = [m for m in metrics(tmp_path) if "reward" in m]
    assert len(ms) == 10 and (tmp_path / "final" / "model.safetensors").exists()
    for m in ms:
        assert m["endpoint/calls"] == 64 and m["endpoint/splits"] == 0  # 32 episodes x 2 calls, one trajectory each
        assert m["reward"] == pytest.approx(m["reward_extra/sevens"] / 12, abs=1e-5)
    rewards = [m["reward"] for m in ms]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.2, f"reward {first:.3f} -> {last:.3f}"


async def no_reward(client, prompt, label, **row):
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt}])


def test_an_agent_function_through_the_python_api_with_the_reward_functions_reward(ws, tmp_path):
    argv = flags(ws, tmp_path, **{"train.max_steps": "2", "reward.remote_url": str(ws / "reward.py")})
    i = argv.index("--agent.func_path")
    del argv[i:i + 2]
    trainer = RLTrainer.from_config(RLConfig.from_args(argv), agent=no_reward)
    seen, generate = [], trainer.loop.source.generate

    def spy(batch, upcoming=None):
        trajs = generate(batch, upcoming)
        seen.extend(trajs)
        return trajs

    trainer.loop.source.generate = spy
    trainer.train()
    ms = [m for m in metrics(tmp_path) if "reward" in m]
    assert len(ms) == 2 and all(m["endpoint/calls"] == 32 for m in ms)
    tok = trainer.tokenizer
    for t in seen:  # the reward file's share of "7"s of the recorded reply, not of re-tokenized text
        reply = tok.decode(t.response_ids.tolist(), skip_special_tokens=True)
        assert t.info["agent_reward"] == pytest.approx(reply.count("7") / 8.0, abs=1e-6)


def test_openrlhf_server_executor_form_trains_through_the_cli(ws, tmp_path):
    """OpenRLHF's server-executor form (its own OpenAI-compatible server over llm_engine.generate, in
    its own thread), only its import lines naming rlhfkit: two steps train, its reward is logged."""
    argv = flags(ws, tmp_path, **{"agent.func_path": str(FIXTURES / "openrlhf_server_executor_agent.py"),
                                  "train.max_steps": "2"})
    assert main(["train", "rl", *argv]) == 0
    ms = [m for m in metrics(tmp_path) if "reward" in m]
    assert len(ms) == 2 and (tmp_path / "final" / "model.safetensors").exists()
    for m in ms:
        assert m["reward_extra/turns"] == 2.0
        assert m["reward"] == pytest.approx(m["reward_extra/sevens"] / 12, abs=1e-5)


def test_rlhfkit_eval_runs_an_agent_function_on_held_out_prompts(ws, tmp_path):
    argv = flags(ws, tmp_path, **{"eval.dataset": str(ws / "prompts.jsonl"), "eval.max_samples": "4",
                                  "eval.n_samples": "2", "eval.temperature": "1.0"})
    assert main(["eval", *argv]) == 0
    out = json.loads((tmp_path / "eval.json").read_text())
    rows = [json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    assert out["prompts"] == 4 and len(rows) == 8 and out["metrics"]["eval/dropped"] == 0
    assert out["metrics"]["eval/reward"] == pytest.approx(sum(r["reward"] for r in rows) / 8)


def test_held_out_evaluation_during_training_runs_the_agent_function(ws, tmp_path):
    """--eval.dataset with an agent file: before and after training the agent's episodes are scored as
    `rlhfkit eval` scores them (eval/reward = the mean of its rewards, its extra_logs averaged)."""
    argv = flags(ws, tmp_path, **{"train.max_steps": "2", "eval.dataset": str(ws / "prompts.jsonl"),
                                  "eval.max_samples": "4", "eval.steps": "2"})
    assert main(["train", "rl", *argv]) == 0
    evals = [m for m in metrics(tmp_path) if "eval/reward" in m]
    assert [m["step"] for m in evals] == [0, 2]
    for m in evals:
        assert m["eval/dropped"] == 0 and m["eval/reward"] == pytest.approx(m["eval/sevens"] / 12, abs=1e-5)


def test_held_out_evaluation_of_an_agent_function_given_in_python(ws, tmp_path):
    """`RLTrainer.from_config(cfg, agent=fn)` with --eval.dataset: the held-out episodes run the same
    function (its None rewards scored by the run's reward file), before and after training."""
    argv = flags(ws, tmp_path, **{"train.max_steps": "1", "reward.remote_url": str(ws / "reward.py"),
                                  "eval.dataset": str(ws / "prompts.jsonl"), "eval.max_samples": "4"})
    i = argv.index("--agent.func_path")
    del argv[i:i + 2]
    out = RLTrainer.from_config(RLConfig.from_args(argv), agent=no_reward).train()
    evals = [m for m in metrics(tmp_path) if "eval/reward" in m]
    assert [m["step"] for m in evals] == [0, 1] and all(m["eval/dropped"] == 0 for m in evals)
    assert out["eval/reward"] == evals[-1]["eval/reward"] and 0 <= out["eval/reward"] <= 1


REWRITING_AGENT = '''
async def agent(client, prompt, label, **row):
    first = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": prompt}])
    # a fresh history: the second call does not extend the first, so the episode is two segments
    second = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "again"}])
    return float((first.choices[0].message.content or "").count("7")
                 + (second.choices[0].message.content or "").count("7"))
'''


def test_generate_runs_agent_functions_one_row_per_episode_with_its_reward(ws, tmp_path):
    (tmp_path / "rewriting.py").write_text(REWRITING_AGENT)
    for name, agent, turns in (("sdk", str(FIXTURES / "openai_sdk_agent.py"), 2), ("rewrite", "rewriting.py", None)):
        out = tmp_path / name
        argv = flags(ws, out, **{"agent.func_path": str(tmp_path / agent) if turns is None else agent,
                                 "data.max_samples": "3", "rollout.n_samples_per_prompt": "2"})
        assert main(["generate", *argv]) == 0
        rows = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
        assert len(rows) == 6 and sorted(r["group"] for r in rows) == [0, 0, 1, 1, 2, 2]  # one row per episode
        assert all(isinstance(r["reward"], float) and r["response_ids"] for r in rows)
        if turns is not None:  # one trajectory per episode: both replies and the agent's feedback between them
            assert all("segments" not in r and "sevens. again" in r["response"] for r in rows)
        else:  # two segments, both replies kept, the row's response the last one's
            assert all(len(r["segments"]) == 2 and r["segments"][-1] == r["response"] for r in rows)
    refused = main(["train", "rs", *flags(ws, tmp_path / "rs", **{"reward.remote_url": str(ws / "reward.py")})])
    assert refused == 2
