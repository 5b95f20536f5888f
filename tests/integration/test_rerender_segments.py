"""--agent.on_rerender segment in RL on a tiny model whose tokenizer has the published Qwen3 chat
template in non-thinking mode (TRL's wheel ships it; skipped without trl): each turn is sampled after
an empty <think></think>, which the template leaves out of earlier turns, so every multi-turn
episode re-renders its history and splits. Through the CLI with a text environment (training and
--eval.dataset), and through the Python API with tools= on a scripted engine."""

import json

import pytest

from rlhfkit.api.rl import RLTrainer
from rlhfkit.cli.main import main
from rlhfkit.config import RLConfig
from tests.integration.conftest import refuse
from tests.unit.agents.conftest import ScriptedEngine, save_tiny_chat_model
from tests.unit.agents.test_tool_templates import QWEN, TEMPLATES, multiply

pytestmark = pytest.mark.skipif(TEMPLATES is None, reason="trl (which ships the published chat templates) "
                                                          "is not installed")

ENV = '''
class Hint:
    def reset(self, seed=None):
        return "Say a word."

    def step(self, action):
        return "another", float("a" in action), False, False, {}
'''

NO_THINK = "<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("segments")
    template = "{%- set enable_thinking = false %}\n" + (TEMPLATES / "qwen3.jinja").read_text()
    save_tiny_chat_model(root / "tiny", template, QWEN)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"q": f"Play {k}.", "a": str(k)}) + "\n"
                                                for k in range(8)))
    (root / "envs.py").write_text(ENV)
    return root


def flags(ws, out, **over):
    f = {"actor.model_name_or_path": str(ws / "tiny"), "data.prompt_dataset": str(ws / "prompts.jsonl"),
         "data.input_key": "q", "data.label_key": "a", "data.apply_chat_template": "true",
         "agent.env": f"{ws / 'envs.py'}:Hint", "agent.max_turns": "2", "agent.on_rerender": "segment",
         "agent.max_response_tokens": "600",
         "rollout.batch_size": "2", "rollout.n_samples_per_prompt": "2", "rollout.max_new_tokens": "8",
         "train.batch_size": "4", "train.micro_batch_size": "4", "train.max_steps": "2",
         "algo.advantage.estimator": "rloo", "actor.autocast": "none", "logger.progress_bar": "false",
         "data.prompt_max_len": "4096", "ckpt.output_dir": str(out), **over}
    return [x for k, v in f.items() if v is not None for x in (f"--{k}", v)]


def test_train_rl_splits_rerendered_text_environment_episodes_through_the_cli(ws, tmp_path):
    argv = ["train", "rl", *flags(ws, tmp_path, **{"eval.dataset": str(ws / "prompts.jsonl"), "eval.max_samples": "2"})]
    assert main(argv) == 0
    ms = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in ms if "reward" in m]
    assert len(steps) == 2 and (tmp_path / "final" / "model.safetensors").exists()
    # every episode has two turns, the second sampled after the re-rendered first (and the second's empty
    # <think></think> dropped once the environment answers it too): 2 segments an episode, 4 episodes a step
    assert all(m["tools/segments"] == 4.0 and m["tools/rerender"] == 8.0 for m in steps)
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert all(a["messages"] == b["messages"] and a["reward"] == b["reward"]
               for a, b in zip(samples[::2], samples[1::2]))
    evals = [m for m in ms if "eval/reward" in m]
    assert len(evals) == 2 and all(m["eval/tools/segments"] == 2.0 for m in evals)  # 2 held-out episodes each


def test_python_api_tools_train_each_segment_on_its_sampled_tokens(ws, tmp_path):
    def policy(ctx):
        if ctx.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n" + NO_THINK):
            return ctx.split("<tool_response>\n")[-1].split("\n")[0] + "<|im_end|>"
        return '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call><|im_end|>'

    cfg = RLConfig.from_args(flags(ws, tmp_path, **{"agent.env": None, "rollout.max_new_tokens": "80"}))
    trainer = RLTrainer.from_config(cfg, tools=[multiply], reward_fn=lambda queries, prompts, labels, **kw: [
        float(q.endswith("42<|im_end|>")) for q in queries],
        make_engine=lambda policy_, tok: ScriptedEngine(tok, policy))
    seen = []
    generate = trainer.loop.source.generate
    trainer.loop.source.generate = lambda batch, upcoming=None: seen.extend(out := generate(batch, upcoming)) or out
    history = trainer.loop.train()
    trainer.tracker.close()
    assert len(history) == 2 and all(m["tools/segments"] == 4.0 for m in history)
    assert all(m["reward"] == 1.0 for m in history)  # each episode scored once, on its last segment (the answer)
    assert len(seen) == 16 and len({t.info["episode"] for t in seen}) == 8  # 2 steps x 4 episodes x 2 segments
    tok = trainer.tokenizer
    for first, second in zip(seen[::2], seen[1::2]):
        assert first.info["episode"] == second.info["episode"] and first.loss_mask.all() and second.loss_mask.all()
        assert tok.decode(first.response_ids.tolist()).startswith("<tool_call>")
        assert tok.decode(second.response_ids.tolist()) == "42<|im_end|>"
        assert tok.decode(second.prompt_ids.tolist()).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n"
                                                               + NO_THINK)


def test_eval_scores_each_episode_once_however_many_segments(ws, tmp_path):
    argv = ["eval", "--actor.model_name_or_path", str(ws / "tiny"), "--eval.dataset", str(ws / "prompts.jsonl"),
            "--data.input_key", "q", "--data.label_key", "a", "--data.apply_chat_template", "true",
            "--eval.max_samples", "3", "--eval.n_samples", "2", "--eval.temperature", "1.0",
            "--agent.env", f"{ws / 'envs.py'}:Hint", "--agent.max_turns", "2", "--agent.on_rerender", "segment",
            "--agent.max_response_tokens", "600", "--rollout.max_new_tokens", "8", "--actor.autocast", "none",
            "--ckpt.output_dir", str(tmp_path)]
    assert main(argv) == 0
    metrics = json.loads((tmp_path / "eval.json").read_text())["metrics"]
    assert metrics["eval/tools/segments"] == 6.0 and metrics["eval/turns"] == 2.0  # 6 episodes, 2 segments each
    rows = [json.loads(line) for line in (tmp_path / "eval_samples.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and [r["sample"] for r in rows] == [0, 1] * 3


def test_the_flag_is_refused_in_one_line_where_it_does_nothing(ws, tmp_path, capsys):
    refuse(["train", "rl", *flags(ws, tmp_path, **{"agent.env": None})], capsys,
           "--agent.on_rerender segment applies to tool-calling and text-environment episodes")
    refuse(["train", "rl", *flags(ws, tmp_path, **{"agent.on_rerender": "drop"})], capsys,
           "--agent.on_rerender: unknown value 'drop'; valid: keep, segment")
