"""The vision engine and the trainer's forward on tiny random VLMs of three families (Qwen2-VL, LLaVA,
Gemma 3), built in code: greedy rollout equals transformers' generate with the same images, the
engine's logprobs equal the trainer's forward, Qwen2-VL's M-RoPE positions are the model's own, the
images change the numbers, the shared-prefix layout falls back to padded rows with the same
gradients, and freezing the vision tower leaves it bit for bit."""

import pytest
import torch
from PIL import Image

from rlhfkit.data.batch import collate
from rlhfkit.data.images import encode
from rlhfkit.models.logprobs import response_logprobs
from rlhfkit.models.tiny_vision import FAMILIES, tiny_vision_model_and_processor
from rlhfkit.models.vision import freeze_visual_encoder, token_type_kwargs, vision_parts
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.vision import VisionEngine
from rlhfkit.trainers.learner import Learner
from rlhfkit.trainers.rl.batching import MicroBatcher
from rlhfkit.trainers.rl.experience import ExperienceMaker
from rlhfkit.trainers.rl.update import LossSettings, PolicyUpdate

COLOURS = ((230, 30, 30), (30, 30, 230), (30, 200, 30))


@pytest.fixture(scope="module", params=FAMILIES)
def vlm(request):
    return tiny_vision_model_and_processor(request.param, seed=0)


def prompts(processor, sizes=((40, 40), (56, 28), (28, 56))):
    """(ids, VisionInputs) of one prompt per colour, each with one image of its size."""
    out = []
    for colour, size in zip(COLOURS, sizes):
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "colour?"}]}]
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(encode(processor, text, [Image.new("RGB", size, colour)]))
    return out


def generate_inputs(model, ids, vision):
    inputs = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    return {**inputs, **vision.tensors, **token_type_kwargs(model, inputs["input_ids"])}


def test_token_type_ids_derived_from_the_ids_are_the_processors(vlm):
    model, processor = vlm
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    out = processor(text=[text], images=[[Image.new("RGB", (40, 40), COLOURS[0])]], return_tensors="pt")
    derived = {k: v.tolist() for k, v in token_type_kwargs(model, out["input_ids"]).items()}
    expected = {k: out[k].tolist() for k in ("mm_token_type_ids", "token_type_ids") if k in out}
    assert derived == expected  # LLaVA takes none
    if model.config.model_type == "paligemma":  # a prefix LM: a prompt alone is all prefix (0)
        assert derived and not any(1 in row for v in derived.values() for row in v)
    else:
        assert all(any(1 in row for row in v) for v in derived.values())


def test_paligemma_types_its_prompt_as_the_prefix_and_its_response_as_the_suffix():
    """PaliGemma's token_type_ids: 0 for the images and the prompt (attending both ways), 1 for the response
    (causal), as its processor types a prompt with a suffix; derived from the prompt lengths, the response
    and the padding after it 1."""
    model, processor = tiny_vision_model_and_processor("paligemma")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    image = [[Image.new("RGB", (40, 40), COLOURS[0])]]
    prompt = processor(text=[text], images=image, return_tensors="pt")["input_ids"]
    out = processor(text=[text], images=image, suffix=["red"], return_tensors="pt")
    lengths = torch.tensor([prompt.shape[1]])
    assert out["token_type_ids"][0, lengths[0]:].tolist() == [1] * 4  # "red" and its EOS
    derived = token_type_kwargs(model, out["input_ids"], lengths)["token_type_ids"]
    assert derived.tolist() == out["token_type_ids"].tolist()


def greedy_equals_generate(model, processor, cached: bool = True) -> None:
    """The engine's greedy rollouts of `prompts(processor)` are model.generate's with the same images."""
    engine = VisionEngine(model, processor.tokenizer)
    engine._cached = engine._cached and cached
    batch = prompts(processor)
    trajs = engine.generate([p for p, _ in batch], SamplingParams(max_new_tokens=8, temperature=0.0),
                            vision=[v for _, v in batch])
    for (ids, vision), t in zip(batch, trajs):
        out = model.generate(**generate_inputs(model, ids, vision), max_new_tokens=8, do_sample=False,
                             suppress_tokens=engine.banned_ids.tolist())
        expected = out[0, len(ids):].tolist()
        assert t.response_ids.tolist() == expected[: t.response_length]
        assert t.info["vision"] is vision


def test_greedy_rollout_equals_generate_with_the_same_images(vlm):
    greedy_equals_generate(*vlm)


def test_a_vlm_decoded_without_a_cache_feeds_its_images_at_every_step():
    """A VLM whose cache the engine cannot copy per sample decodes over the whole sequence at every step,
    its images with it (forced here on Qwen3.5, whose DeltaNet states the engine does copy)."""
    greedy_equals_generate(*tiny_vision_model_and_processor("qwen3_5"), cached=False)


def test_rollout_logprobs_equal_the_trainers_forward(vlm):
    rollout_logprobs_equal_the_trainers(*vlm)


def test_decode_steps_take_image_inputs_only_where_the_family_has_per_token_ones(vlm):
    """A cached decode step's image inputs are made once at the prefill: none for a family without per-token
    image inputs, Llama 3.2 Vision's cross-attention mask row (the prompt's last token's, one per row) else."""
    model, processor = vlm
    engine = VisionEngine(model, processor.tokenizer)
    hook, seen = engine._decode_extra, []
    engine._decode_extra = lambda s: seen.append(hook(s)) or seen[-1]
    batch = prompts(processor)
    engine.generate([p for p, _ in batch], SamplingParams(max_new_tokens=3, temperature=0.9, n=2),
                    seeds=[1, 2, 3], vision=[v for _, v in batch])
    assert len(seen) == (3 * 2 if engine._cached else 0)  # steps 2 and 3 of each of the three prompts
    for extra in seen:
        if model.config.model_type != "mllama":
            assert extra is None
            continue
        rows = extra["cross_attention_mask"].shape[0]  # 2, or 1 once a finished row left the batch
        assert set(extra) == {"cross_attention_mask"} and rows in (1, 2)
        masks = [v.tensors["cross_attention_mask"] for _, v in batch]  # one of the prompts' last rows
        assert any(torch.equal(extra["cross_attention_mask"], m[:, -1:].expand(rows, 1, *m.shape[2:])) for m in masks)


def test_paligemma_decoded_without_a_cache_types_its_response_as_the_suffix():
    """Each uncached step types the sampled tokens 1 (causal), as the trainer's forward types the response:
    typed 0 with the prompt, the prompt's tokens would attend to them and the logprobs differ."""
    rollout_logprobs_equal_the_trainers(*tiny_vision_model_and_processor("paligemma"), cached=False)


def rollout_logprobs_equal_the_trainers(model, processor, cached: bool = True) -> None:
    engine = VisionEngine(model, processor.tokenizer)
    engine._cached = engine._cached and cached
    batch = prompts(processor)
    trajs = engine.generate([p for p, _ in batch], SamplingParams(max_new_tokens=6, temperature=0.9, n=3),
                            seeds=[1, 2, 3], vision=[v for _, v in batch])
    padded = collate(trajs, processor.tokenizer.pad_token_id)
    logp, _ = response_logprobs(model, padded, temperature=0.9)
    rollout = torch.zeros_like(logp)
    for i, t in enumerate(trajs):
        rollout[i, : t.response_length] = t.logprobs
    torch.testing.assert_close(logp, rollout, rtol=0, atol=2e-5)
    placeholders = engine.banned_ids
    assert not torch.isin(padded.response_ids[padded.response_mask], placeholders).any()


def test_the_images_change_the_logprobs(vlm):
    """The forward uses the images: the same ids with another image's pixels give other logprobs."""
    model, processor = vlm
    engine = VisionEngine(model, processor.tokenizer)
    (ids, red), (same_ids, blue), _ = prompts(processor, sizes=((40, 40),) * 3)
    assert same_ids == ids
    traj = engine.generate([ids], SamplingParams(max_new_tokens=6, temperature=1.0), seeds=[0], vision=[red])[0]
    traj_blue = type(traj)(**{**traj.__dict__, "info": {"vision": blue}})
    a, _ = response_logprobs(model, collate([traj], 0))
    b, _ = response_logprobs(model, collate([traj_blue], 0))
    assert (a - b).abs().max() > 1e-4


def test_qwen2_vl_decodes_with_its_m_rope_positions():
    """Qwen2-VL's image tokens take 3-D positions, and the text after them starts at the highest
    one + 1: the engine's decode positions are shifted by that delta. Positions 0..L-1 instead give
    other logits at every response token."""
    model, processor = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    (ids, vision), *_ = prompts(processor, sizes=((56, 56),) * 3)  # 2x2 merged patches: a delta of -2
    engine = VisionEngine(model, processor.tokenizer)
    traj = engine.generate([ids], SamplingParams(max_new_tokens=5, temperature=1.0), seeds=[4], vision=[vision])[0]
    inputs = generate_inputs(model, ids + traj.response_ids.tolist(), vision)
    _, delta = model.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"],
                                                  vision.tensors["image_grid_thw"])
    assert int(delta) == -2
    with torch.no_grad():
        own = torch.log_softmax(model(**inputs).logits[0].float(), -1)
        plain = torch.arange(len(inputs["input_ids"][0])).view(1, 1, -1).expand(3, 1, -1)
        flat = torch.log_softmax(model(**inputs, position_ids=plain).logits[0].float(), -1)
    p, r = len(ids), traj.response_length
    targets = traj.response_ids
    at = torch.arange(p - 1, p - 1 + r)
    torch.testing.assert_close(own[at, targets], traj.logprobs, rtol=0, atol=2e-5)
    assert (flat[at, targets] - traj.logprobs).abs().max() > 1e-4


def experience(model, processor, shared_prefix: bool, estimator: str = "group_norm"):
    engine = VisionEngine(model, processor.tokenizer)
    batch = prompts(processor)[:2]
    trajs = engine.generate([p for p, _ in batch], SamplingParams(max_new_tokens=5, temperature=1.0, n=2),
                            seeds=[5, 6], vision=[v for _, v in batch])
    batcher = MicroBatcher(processor.tokenizer.pad_token_id, 2, shared_prefix=shared_prefix)
    maker = ExperienceMaker(model, None, None, batcher, estimator=estimator, gamma=1.0, lam=1.0, whiten=False,
                            reward_clip=None, kl_estimator="k1", kl_in_reward=False, multi_step=True,
                            temperature=1.0, autocast=None)
    return maker(trajs, torch.tensor([1.0, 0.0, 0.0, 1.0]), kl_coef=0.0), batcher


def gradients(model, processor, shared_prefix: bool, estimator: str = "group_norm", **losses) -> dict:
    exp, batcher = experience(model, processor, shared_prefix, estimator)
    learner = Learner(model, 1e-2, total_steps=2)
    update = PolicyUpdate(model, learner, batcher, LossSettings(max_len=5, **losses), batch_size=4, max_epochs=1,
                          shuffle_gen=torch.Generator().manual_seed(0), autocast=None)
    grads = {}
    hook = learner.step
    learner.step = lambda *a, **k: grads.update({n: p.grad.clone() for n, p in model.named_parameters()
                                                 if p.grad is not None}) or hook(*a, **k)
    update(exp, kl_coef=0.0)
    return grads


def test_shared_prefix_layout_falls_back_to_padded_rows_with_the_same_gradients(vlm, caplog):
    model, processor = vlm
    fresh = type(model)(model.config)
    fresh.load_state_dict(model.state_dict())
    state = {k: v.clone() for k, v in fresh.state_dict().items()}
    with caplog.at_level("INFO", logger="rlhfkit"):
        shared = gradients(fresh, processor, shared_prefix=True)
    fresh.load_state_dict(state)
    padded = gradients(fresh, processor, shared_prefix=False)
    assert shared.keys() == padded.keys() and any("vision" in n or "visual" in n for n in shared)
    for name in padded:
        torch.testing.assert_close(shared[name], padded[name], rtol=1e-5, atol=1e-7)


def test_freeze_visual_encoder_leaves_the_tower_bit_identical_and_trains_the_rest(vlm):
    model, processor = vlm
    frozen = type(model)(model.config)
    frozen.load_state_dict(model.state_dict())
    assert freeze_visual_encoder(frozen) > 0
    tower = {f"{n}.{k}": v.clone() for n, m in vision_parts(frozen) for k, v in m.state_dict().items()}
    before = {k: v.clone() for k, v in frozen.state_dict().items()}
    gradients(frozen, processor, shared_prefix=False)
    after = frozen.state_dict()
    now = {f"{n}.{k}": v for n, m in vision_parts(frozen) for k, v in m.state_dict().items()}
    assert all(torch.equal(tower[k], now[k]) for k in tower)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the language model moved
    free = type(model)(model.config)
    free.load_state_dict(model.state_dict())
    gradients(free, processor, shared_prefix=False)
    moved = {f"{n}.{k}": v for n, m in vision_parts(free) for k, v in m.state_dict().items()}
    assert any(not torch.equal(tower[k], moved[k]) for k in tower)  # unfrozen, the tower trains


@pytest.mark.parametrize("estimator,losses", [
    ("rloo", {}), ("reinforce", {}), ("reinforce_baseline", {}), ("dr_grpo", {}),
    ("group_norm", {"is_kind": "tis"}), ("group_norm", {"decoupled": True}),
])
def test_critic_free_estimators_and_off_policy_corrections_train_through_the_images(estimator, losses):
    """Each estimator's update reaches the vision tower (its gradients flow through the images)."""
    model, processor = tiny_vision_model_and_processor("qwen2_vl", seed=0)
    grads = gradients(model, processor, shared_prefix=False, estimator=estimator, **losses)
    tower = [g for n, g in grads.items() if ".visual." in f".{n}"]
    assert tower and any(g.abs().sum() > 0 for g in tower)
