"""Tool-calling and text-environment episodes with a vision-language policy (the tiny random Qwen2-VL,
its tokenizer with `{}[]` so a call's JSON can be written): the prompt is rendered with the tools by the
processor and its image tokens expanded by it, the prompt's image tensors go with every turn's engine
call and into the trainer's forward, tool results are masked text; rollout logprobs equal the forward."""

import pytest
from PIL import Image

from rlhfkit.agents import TokenBudget
from rlhfkit.agents.textenv import text_env
from rlhfkit.agents.tools.agent import ToolExecutor
from rlhfkit.data.images import encode
from rlhfkit.data.types import PromptItem
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.vision import VisionEngine
from tests.unit.agents.conftest import FirstTurnCalls, forward_gap

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: the first
        b: the second
    """
    return a + b


@pytest.fixture(scope="module")
def vlm(json_vlm):
    return json_vlm("qwen2_vl")


def image_prompt(processor, colour=(30, 200, 30)):
    """A PromptItem as data.images makes it: the question as the raw prompt, one 56x56 image."""
    image = Image.new("RGB", (56, 56), colour)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids, vision = encode(processor, text, [image])
    return PromptItem(text, ids, None, raw="colour?", vision=vision, images=[image])


def tool_episodes(vlm, drop_images=False, n=2, overlap=False):
    model, proc = vlm
    tok = proc.tokenizer
    engine = FirstTurnCalls(VisionEngine(model, tok), tok(CALL, add_special_tokens=False)["input_ids"] +
                            [tok.eos_token_id], tok.pad_token_id, drop_images)
    executor = ToolExecutor([add], overlap=overlap)
    executor.processor = proc
    prompt = image_prompt(proc)
    trajs = executor.run(engine, tok, [prompt], SamplingParams(max_new_tokens=6, temperature=1.0, n=n),
                         TokenBudget(per_turn=80, total=160, max_turns=2), seeds=[7])
    return trajs, prompt, engine, executor


@pytest.mark.parametrize("overlap", [False, True])
def test_a_tool_call_episode_with_images_matches_the_trainers_forward(vlm, overlap):
    """Turn by turn, and with each episode on its own (overlap: a TurnBatcher batches the turns)."""
    model, proc = vlm
    trajs, prompt, engine, executor = tool_episodes(vlm, overlap=overlap)
    image = model.config.image_token_id
    assert engine.calls and all(v is not None and all(x is prompt.vision for x in v) for v in engine.calls)
    for t in trajs:
        assert t.info["tool_calls"] == 1 and t.info["turns"] == 2 and t.info["vision"] is prompt.vision
        rendered = proc.tokenizer.decode(t.prompt_ids, skip_special_tokens=False)
        assert "<tools>" in rendered and '"name": "add"' in rendered  # the schemas joined the prompt
        assert int((t.prompt_ids == image).sum()) == prompt.ids.count(image) == 4  # the processor's expansion
        result = t.response_ids[~t.loss_mask]
        assert "<tool_response>\n5\n</tool_response>" in proc.tokenizer.decode(result, skip_special_tokens=False)
        assert not (t.response_ids == image).any() and t.loss_mask[-1]  # turn 2 follows the masked result
    assert executor.pop_metrics()["tools/rerender"] == 0.0  # the turn check encodes through the processor
    assert forward_gap(model, proc, trajs).max() < 2e-5


def test_without_the_image_tensors_on_the_second_turn_the_logprobs_differ(vlm):
    """The switch-off: turn 2 sampled without the prompt's image tensors (the image tokens then embed as
    plain tokens) no longer matches the trainer's forward, which holds the images."""
    model, proc = vlm
    trajs, *_ = tool_episodes(vlm, drop_images=True)
    assert forward_gap(model, proc, trajs).max() > 1e-3


class Colours:
    """A text environment: its first observation asks again; each action gets a hint until turn 2."""

    def reset(self, seed=None):
        self.turn = 0
        return "Look closely."

    def step(self, action):
        self.turn += 1
        return "Try again.", 0.5, self.turn >= 2, False, {}


def test_a_text_environment_episode_with_images_matches_the_trainers_forward(vlm):
    model, proc = vlm
    executor = ToolExecutor(environment_factory=text_env(Colours))
    executor.processor = proc
    prompt = image_prompt(proc)
    engine = VisionEngine(model, proc.tokenizer)
    trajs = executor.run(engine, proc.tokenizer, [prompt], SamplingParams(max_new_tokens=4, temperature=1.0, n=2),
                         TokenBudget(per_turn=4, total=60, max_turns=2), seeds=[3])
    for t in trajs:
        rendered = proc.tokenizer.decode(t.prompt_ids, skip_special_tokens=False)
        assert "colour?" in rendered and "Look closely." in rendered  # the first observation joined the prompt
        assert int((t.prompt_ids == model.config.image_token_id).sum()) == 4
        assert t.info["turns"] == 2 and t.info["agent_reward"] == 1.0 and t.info["vision"] is prompt.vision
        assert "Try again." in proc.tokenizer.decode(t.response_ids[~t.loss_mask])
    assert forward_gap(model, proc, trajs).max() < 2e-5


def test_a_segment_after_a_rerender_keeps_the_prompts_images(vlm, monkeypatch):
    """--agent.on_rerender segment: a re-rendered history (forced here: every check says RERENDER)
    starts a new segment from the conversation as rendered and encoded by the processor; its prompt
    holds the image's tokens, its trajectory the prompt's image tensors, its logprobs the forward's."""
    from rlhfkit.agents.tools import render

    model, proc = vlm
    tok = proc.tokenizer
    engine = FirstTurnCalls(VisionEngine(model, tok), tok(CALL, add_special_tokens=False)["input_ids"] +
                            [tok.eos_token_id], tok.pad_token_id)
    executor = ToolExecutor([add], on_rerender="segment")
    executor.processor = proc
    check = render.ToolTemplate.rendered_check
    monkeypatch.setattr(render.ToolTemplate, "rendered_check",
                        lambda self, *a, **k: (render.RERENDER, check(self, *a, **k)[1]))
    prompt = image_prompt(proc)
    trajs = executor.run(engine, tok, [prompt], SamplingParams(max_new_tokens=6, temperature=1.0),
                         TokenBudget(per_turn=80, total=160, max_turns=2), seeds=[7])
    assert len(trajs) == 2 and all(t.info["vision"] is prompt.vision for t in trajs)
    second = trajs[1]
    image = model.config.image_token_id
    assert int((second.prompt_ids == image).sum()) == 4 and second.loss_mask.all()
    tail = tok.decode(second.prompt_ids, skip_special_tokens=False)
    assert "<tool_response>\n5\n</tool_response>" in tail  # the tool result, rendered into the new prompt
    assert forward_gap(model, proc, trajs).max() < 2e-5
