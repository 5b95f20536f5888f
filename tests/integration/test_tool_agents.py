"""Tool calling in RL: a few training steps with tools given as functions, through the CLI
(`--agent.tools FILE:fn`) on a tiny model, and through the Python API (`tools=[fn]`) with a
scripted engine that calls the tool, so the calls, their masked results and the metrics are seen."""

import json

import pytest

from rlhfkit.api.rl import RLTrainer
from rlhfkit.cli.main import main
from rlhfkit.config import RLConfig
from tests.integration.conftest import rl_flags
from tests.unit.agents.conftest import ScriptedEngine, save_tiny_chat_model

TOOLS = '''
def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b
'''

# the answer after the last tool response counts: 1 when it holds the label
REWARD = '''
def reward_func(queries, prompts, labels, **kwargs):
    out = []
    for q, p, label in zip(queries, prompts, labels):
        tail = q[len(p):].split("</tool_response>")[-1]
        out.append(1.0 if str(label) in tail else 0.0)
    return out
'''


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def calling_policy(ctx):
    """Calls multiply on the question's factors, then answers with the tool's result."""
    if ctx.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n"):
        return ctx.split("<tool_response>\n")[-1].split("\n")[0] + "<|im_end|>"
    a, b = ctx.rsplit("<|im_start|>user\n", 1)[1].split("?")[0].split("*")
    return f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call><|im_end|>'


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("tools")
    save_tiny_chat_model(root / "tiny")
    rows = [{"q": [{"role": "user", "content": f"{a}*{b}?"}], "a": str(a * b)}
            for a in range(2, 6) for b in range(2, 6)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "tools.py").write_text(TOOLS)
    (root / "reward.py").write_text(REWARD)
    return root


def flags(ws, out, **over):
    return rl_flags(ws, out, **{
        "data.apply_chat_template": "true", "agent.tools": f"{ws / 'tools.py'}:multiply", "agent.max_turns": "2",
        "rollout.batch_size": "4", "rollout.n_samples_per_prompt": "2", "rollout.max_new_tokens": "60",
        "train.batch_size": "8", "train.micro_batch_size": "8", "train.max_steps": "2",
        "data.prompt_max_len": "2048", **over})


def test_train_rl_with_agent_tools_through_the_cli(ws, tmp_path):
    assert main(["train", "rl", *flags(ws, tmp_path)]) == 0
    ms = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in ms if "reward" in m]
    assert len(steps) == 2 and (tmp_path / "final" / "model.safetensors").exists()
    assert all("tools/valid_call_rate" in m and "tools/rerender" in m for m in steps)


def test_python_api_tools_run_in_episodes_and_their_results_never_count_in_the_loss(ws, tmp_path):
    cfg = RLConfig.from_args(flags(ws, tmp_path, **{"agent.tools": None, "rollout.max_new_tokens": "100"}))
    seen = []
    trainer = RLTrainer.from_config(cfg, tools=[multiply],
                                    make_engine=lambda policy_, tok: ScriptedEngine(tok, calling_policy))
    generate = trainer.loop.source.generate

    def spy(batch, upcoming=None):
        trajs = generate(batch, upcoming)
        seen.extend(trajs)
        return trajs

    trainer.loop.source.generate = spy
    history = trainer.loop.train()
    trainer.tracker.close()
    assert len(history) == 2, history
    assert all(m["reward"] == 1.0 for m in history)  # the tool's product is the answer
    assert all(m["tools/multiply/calls"] == 8 and m["tools/valid_call_rate"] == 1.0 for m in history)
    assert all(m["tools/rerender"] == 0 and m["tools/retokenized"] == 0 for m in history)
    tok = trainer.tokenizer
    for t in seen:
        r, mask = t.response_ids.tolist(), t.loss_mask.tolist()
        text_masked_out = tok.decode([x for x, m in zip(r, mask) if not m])
        assert "<tool_response>" in text_masked_out and "<tool_call>" not in text_masked_out
        assert t.info["messages"][2]["role"] == "tool"


class Product:
    """TRL's environment_factory contract: a calculator whose reward is whether the product was asked for."""

    def reset(self, a: str = "", **row):
        self.label, self.asked = a, None

    def multiply(self, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: the first factor
            b: the second factor
        """
        self.asked = str(a * b)
        return a * b

    def get_reward(self) -> float:
        return float(self.asked == self.label)


def test_python_api_environment_factory_gives_the_rewards(ws, tmp_path):
    def policy(ctx):
        if ctx.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n"):
            return "ok<|im_end|>"
        a, b = ctx.rsplit("<|im_start|>user\n", 1)[1].split("?")[0].split("*")
        return f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call><|im_end|>'

    cfg = RLConfig.from_args(flags(ws, tmp_path, **{"agent.tools": None, "reward.remote_url": None,
                                                    "rollout.max_new_tokens": "100"}))
    trainer = RLTrainer.from_config(cfg, environment_factory=Product,
                                    make_engine=lambda policy_, tok: ScriptedEngine(tok, policy))
    history = trainer.loop.train()
    trainer.tracker.close()
    assert len(history) == 2 and all(m["reward"] == 1.0 for m in history)  # from get_reward, no reward function
    assert all(m["tools/multiply/calls"] == 8 for m in history)


def test_generate_runs_tool_episodes_and_saves_the_conversation(ws, tmp_path):
    argv = ["generate", "--actor.model_name_or_path", str(ws / "tiny"), "--data.prompt_dataset",
            str(ws / "prompts.jsonl"), "--data.input_key", "q", "--data.label_key", "a", "--data.apply_chat_template",
            "true", "--data.max_samples", "2", "--agent.tools", f"{ws / 'tools.py'}:multiply", "--agent.max_turns", "2",
            "--rollout.max_new_tokens", "16", "--rollout.n_samples_per_prompt", "2", "--actor.autocast", "none",
            "--logger.progress_bar", "false", "--ckpt.output_dir", str(tmp_path)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (tmp_path / "generations.jsonl").read_text().splitlines()]
    assert len(rows) == 4
    for r in rows:
        first = r["messages"][0]
        assert first["role"] == "user" and first["content"] in r["prompt"] and "?" in first["content"]
        assert r["messages"][1]["role"] == "assistant"  # then the tool results of its calls, if any


def test_eval_runs_tool_episodes_and_saves_the_conversations(ws, tmp_path):
    argv = ["eval", "--actor.model_name_or_path", str(ws / "tiny"), "--eval.dataset", str(ws / "prompts.jsonl"),
            "--data.input_key", "q", "--data.label_key", "a", "--data.apply_chat_template", "true",
            "--eval.max_samples", "3", "--eval.n_samples", "2", "--eval.temperature", "1.0", "--eval.k", "1,2",
            "--agent.tools", f"{ws / 'tools.py'}:multiply", "--agent.max_turns", "2", "--rollout.max_new_tokens", "16",
            "--reward.remote_url", str(ws / "reward.py"), "--actor.autocast", "none",
            "--ckpt.output_dir", str(tmp_path)]
    assert main(argv) == 0
    metrics = json.loads((tmp_path / "eval.json").read_text())["metrics"]
    assert {"eval/tool_calls", "eval/episodes_with_call", "eval/tools/valid_call_rate", "eval/turns",
            "eval/pass@2"} <= set(metrics)
    rows = [json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(r["messages"][0]["role"] == "user" and "tool_calls" in r for r in rows)
    assert main(["view", str(tmp_path), "--file", "eval_samples.jsonl"]) == 0
    assert '"turns": [{"role": "assistant"' in (tmp_path / "eval_samples.html").read_text()


def test_held_out_evaluation_during_training_runs_tool_episodes(ws, tmp_path):
    cfg = RLConfig.from_args(flags(ws, tmp_path, **{"agent.tools": None, "rollout.max_new_tokens": "100",
                                                    "train.max_steps": "1", "eval.dataset": str(ws / "prompts.jsonl"),
                                                    "eval.max_samples": "4"}))
    trainer = RLTrainer.from_config(cfg, tools=[multiply],
                                    make_engine=lambda policy_, tok: ScriptedEngine(tok, calling_policy))
    trainer.train()
    evals = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in evals if "eval/accuracy" in m]
    assert len(evals) == 2  # before and after training
    assert all(m["eval/accuracy"] == 1.0 and m["eval/tool_calls"] == 1.0 for m in evals)
    assert all(m["eval/tools/multiply/calls"] == 4.0 for m in evals)  # the eval's own counters, not the rollout's
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert samples and all([m["role"] for m in s["messages"]][-3:] == ["assistant", "tool", "assistant"]
                           for s in samples)


class SeededCaller(ScriptedEngine):
    """Calls the tool on an odd seed (then answers with its result), answers 0 at once on an even one:
    the samples of a group differ or agree by their seeds. Counts the actions that call."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, calling_policy)
        self.calling_actions = 0

    def generate(self, prompts, params, generator=None, group_ids=None, seeds=None):
        out = []
        for p, s in zip(prompts, seeds):
            self.policy = lambda ctx, s=s: calling_policy(ctx) if s % 2 or "</tool_response>" in ctx else "0<|im_end|>"
            out += super().generate([p], params, seeds=[s])
            self.calling_actions += "<tool_call>" in self.tokenizer.decode(out[-1].response_ids.tolist())
        return out


def test_dynamic_filtering_tops_tool_episodes_up_and_counts_every_rounds_calls(ws, tmp_path):
    # groups whose 2 episodes both answer right (or both wrong) are dropped and new prompts' episodes
    # top the batch up; the step's tool counters cover the calls of all of its rounds
    cfg = RLConfig.from_args(flags(ws, tmp_path, **{"agent.tools": None, "rollout.max_new_tokens": "100",
                                                    "algo.dynamic_filtering_enable": "true",
                                                    "algo.dynamic_filtering_max_rounds": "3",
                                                    "train.num_episodes": "3"}))
    engines = []
    trainer = RLTrainer.from_config(cfg, tools=[multiply],
                                    make_engine=lambda policy_, tok: engines.append(SeededCaller(tok)) or engines[-1])
    history = trainer.loop.train()
    trainer.tracker.close()
    assert len(history) == 2
    assert sum(m["filtered_groups"] for m in history) >= 1 and max(m["dynamic_rounds"] for m in history) >= 2
    assert sum(m["tools/calls"] for m in history) == engines[0].calling_actions > 0
    assert all(m["tools/valid_call_rate"] == 1.0 for m in history)
