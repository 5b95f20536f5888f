"""Tool-calling and text-environment episodes on Ray (rollout worker actors + a trainer actor), with
a tiny model taught in the fixture to call the tool: the episodes run in the trainer actor against
the workers, their tools and environment built there from --agent.tools / --agent.env; the tool
counters reach the metrics of every step (also in async runs, where the batch ahead runs meanwhile);
held-out evaluation runs tool episodes on the workers too."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

ray = pytest.importorskip("ray")
# about 2 minutes (the fixture teaches the model to call the tool): run by hand with -m slow
pytestmark = pytest.mark.slow

from rlhfkit.agents.tools.render import ToolTemplate  # noqa: E402 - after the Ray settings and importorskip
from rlhfkit.agents.tools.schema import ToolSet  # noqa: E402 - likewise
from rlhfkit.cli.main import main  # noqa: E402 - likewise
from rlhfkit.distributed.launch import ray_temp_dir  # noqa: E402 - likewise
from tests.integration.conftest import cli_flags  # noqa: E402 - likewise
from tests.unit.agents.conftest import save_tiny_chat_model  # noqa: E402 - likewise
from tests.unit.agents.test_tools import multiply  # noqa: E402 - likewise

# every second call sleeps SLEEP seconds: while those run, the episodes of the fast calls go on
TOOLS = '''
import itertools
import time

CALLS = itertools.count()


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    if next(CALLS) % 2:
        time.sleep(SLEEP)
    return a * b
'''

ENV = '''
class Guess:
    def reset(self, seed=None):
        self.target = (seed or 0) % 10
        return "Guess my digit."

    def step(self, action):
        right = action.strip()[:1] == str(self.target)
        return ("yes" if right else "no"), float(right), right, False, {}
'''

# 1 for an episode that answers "7" (with --algo.advantage.estimator reinforce, not whitened, the
# advantage is the reward: the taught policy's samples are alike, a baseline would leave nothing to learn)
REWARD = '''
def reward_func(queries, prompts, labels, **kwargs):
    return [float("7" in q[len(p):]) for q, p in zip(queries, prompts)]
'''

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
AFTER = "\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def teach_to_call(folder, questions, steps=60):
    """The tiny chat model taught (plain cross-entropy, full batch) to answer a question with CALL and
    the tool's response with "7", then saved back: a policy that calls tools on Ray workers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    tt = ToolTemplate(tok, ToolSet([multiply]).schemas, None)
    pairs = []
    for q in questions:
        prompt = tok.decode(tt.prompt_ids([{"role": "user", "content": q}]), skip_special_tokens=False)
        pairs += [(prompt, CALL), (prompt + CALL + AFTER, "7<|im_end|>")]
    enc = [(tok(p, add_special_tokens=False)["input_ids"], tok(a, add_special_tokens=False)["input_ids"])
           for p, a in pairs]
    width = max(len(p) + len(a) for p, a in enc)
    ids = torch.full((len(enc), width), tok.pad_token_id)
    labels = torch.full((len(enc), width), -100)
    for i, (p, a) in enumerate(enc):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p): len(p) + len(a)] = torch.tensor(a)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        logits = model(ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(folder)
    return loss.item()


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = tmp_path_factory.mktemp("raytools")
    save_tiny_chat_model(root / "tiny")
    questions = [f"{a}*{b}?" for a in range(2, 4) for b in range(2, 4)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:  # the questions as they are and with the environment's first observation
        assert teach_to_call(root / "tiny", questions + [q + "\n\nGuess my digit." for q in questions]) < 0.05
    finally:
        torch.set_num_threads(threads)
    rows = [{"q": q, "seed": 7 * (i % 2)} for i, q in enumerate(questions)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "tools.py").write_text(TOOLS.replace("SLEEP", "0.0"))
    (root / "slow_tools.py").write_text(TOOLS.replace("SLEEP", "0.5"))
    (root / "envs.py").write_text(ENV)
    (root / "reward.py").write_text(REWARD)
    return root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray.init(num_cpus=3, _temp_dir=ray_temp_dir(tmp_path_factory.mktemp("ray")), include_dashboard=False)
    yield
    ray.shutdown()


def flags(ws, out, **over):
    return ["train", "rl", *cli_flags({
        "actor.model_name_or_path": str(ws / "tiny"), "data.prompt_dataset": str(ws / "prompts.jsonl"),
        "data.input_key": "q", "data.apply_chat_template": "true", "agent.tools": f"{ws / 'tools.py'}:multiply",
        "agent.max_turns": "2", "reward.remote_url": str(ws / "reward.py"), "distributed.backend": "ray",
        "rollout.batch_size": "2", "rollout.n_samples_per_prompt": "2", "rollout.max_new_tokens": "80",
        "rollout.temperature": "0.5",
        "train.batch_size": "4", "train.micro_batch_size": "4", "train.max_steps": "2", "train.num_threads": "1",
        "actor.autocast": "none", "actor.adam.lr": "1e-5", "algo.advantage.estimator": "reinforce",
        "algo.advantage.whiten": "false", "logger.progress_bar": "false",
        "data.prompt_max_len": "4096", "ckpt.output_dir": str(out), **over})]


def steps_and_evals(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "reward" in r], [r for r in rows if "eval/reward" in r]


def moved(ws, out):
    before, after = load_file(ws / "tiny" / "model.safetensors"), load_file(out / "final" / "model.safetensors")
    return any(not torch.equal(before[k], after[k]) for k in before)


def test_tools_train_on_ray_workers_and_evaluate_with_tools(ws, cluster, tmp_path):
    out = tmp_path / "run"
    assert main(flags(ws, out, **{"eval.dataset": str(ws / "prompts.jsonl"), "eval.max_samples": "2"})) == 0
    steps, evals = steps_and_evals(out)
    assert len(steps) == 2 and moved(ws, out)
    assert all(s["tools/calls"] >= 1 and s["tools/busy_s"] > 0 for s in steps)
    assert sum(s.get("tools/multiply/calls", 0) for s in steps) >= 1
    assert len(evals) == 2 and all(e["eval/tools/multiply/calls"] >= 1 for e in evals)


def test_a_text_environment_with_a_slow_tool_trains_async_on_ray(ws, cluster, tmp_path):
    # the episodes call the tool (every second call takes 0.5 s), then act in the environment; the
    # episodes of fast calls generate their next turn on the workers while the slow calls run; each
    # step logs its own batch's calls
    out = tmp_path / "run"
    assert main(flags(ws, out, **{"agent.tools": f"{ws / 'slow_tools.py'}:multiply",
                                  "agent.env": f"{ws / 'envs.py'}:Guess", "agent.env_reward_weight": "1",
                                  "train.async_enable": "true", "train.max_staleness": "1"})) == 0
    steps, _ = steps_and_evals(out)
    assert len(steps) == 2 and moved(ws, out)
    assert all(s["tools/calls"] >= 1 for s in steps) and max(s["tools/busy_s"] for s in steps) >= 0.5
    assert sum(s["tools/generate_during_tools"] for s in steps) >= 1
    assert sum(s["tools/overlap_s"] for s in steps) > 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    # a tool turn, then an action the environment answers (its observation comes back as a user turn)
    assert any([m["role"] for m in s["messages"]][1:4] == ["assistant", "tool", "assistant"]
               and s["messages"][4]["role"] == "user" for s in samples if len(s["messages"]) > 4)
