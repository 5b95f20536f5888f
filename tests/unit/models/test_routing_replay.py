"""Routing replay (R3) on tiny Qwen3-MoE, Mixtral and DeepSeek-V3 models: the HF engine records the experts of
every token it computes, the trainer's forward routes each token to them in every batch layout (padded,
packed, shared-prefix), and that undoes a flipped router choice (the tie test); the routing weights are the
router's own, so the gradient reaches it (by hand on a 2-expert toy)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from rlhfkit.agents import MultiTurnExecutor, TokenBudget
from rlhfkit.core.moe import missing_code, skip_code
from rlhfkit.data.batch import collate
from rlhfkit.data.packing import pack, pack_shared_prefix
from rlhfkit.errors import TrainingError
from rlhfkit.models import response_logprobs
from rlhfkit.models.moe import (
    record_routing,
    replay_routing,
    replayable_routers,
    replayed,
)
from rlhfkit.models.tiny import MOE_ARCHITECTURES, tiny_model_and_tokenizer
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from tests.unit.agents.test_executor_kept_turns import FeedbackAgent, TextPrompt

PROMPTS = ["hello world, this is a long shared preamble: 2+3=", "hello world, this is a long shared preamble: 7*6=",
           "the cat sat on"]  # the first two share a prefix the engine prefills once
PARAMS = SamplingParams(n=2, max_new_tokens=8, temperature=1.0)
LAYOUTS = ("padded", "packed", "shared_prefix")


def moe_model(arch):
    """A tiny `arch` model of 3 layers (DeepSeek-V3's first is dense: routing flips in its second layer then
    reach the third through attention, not only the flipped token's own logits)."""
    return tiny_model_and_tokenizer(seed=0, arch=arch, layers=3)


def rollout(model, tok, prompts=PROMPTS, params=PARAMS):
    engine = HFEngine(model, tok, record_experts=True)
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    return engine.generate(ids, params, generator=torch.Generator().manual_seed(0))


def laid_out(trajs, tok, layout):
    batch = collate(trajs, tok.pad_token_id)
    if layout == "packed":
        return pack(trajs, tok.pad_token_id)
    if layout == "shared_prefix":
        shared = pack_shared_prefix(batch, torch.arange(len(trajs)), tok.pad_token_id, 512)
        assert shared.num_tokens < batch.num_tokens  # each prompt computed once for its samples
        return shared
    return batch


def gap(model, trajs, batch, replay: bool):
    """max |trainer - rollout| logprob over the action tokens, and the replay's metrics."""
    with torch.no_grad(), replayed(model, batch, replay) as (run, counts):
        logp, _ = response_logprobs(model, run)
    got = torch.cat([logp[b, : t.response_length][t.loss_mask] for b, t in enumerate(trajs)])
    metrics = {k: float(v) for k, v in counts.metrics().items()} if counts is not None else None
    return float((got - torch.cat([t.logprobs[t.loss_mask] for t in trajs])).abs().max()), metrics


def tied(model):
    """Every router's experts 0 and 1 tied (equal rows): where they straddle the top-k boundary, the
    tie decides which one a token gets."""
    with torch.no_grad():
        for router in replayable_routers(model):
            router.weight[1] = router.weight[0]
    return model


def nudged(model, eps=1e-6):
    """A copy of `model` whose routers' expert 1 scores (1 + eps) times expert 0: the tie goes one way or the
    other by the sign of the token's logit, as a rounding difference between two engines would decide it."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        for router in replayable_routers(other):
            router.weight[1] *= 1 + eps
    return other


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_the_replayed_forward_gives_the_rollouts_logprobs_in_every_layout(arch, layout):
    model, tok = moe_model(arch)
    trajs = rollout(model, tok)
    layers = len(replayable_routers(model))
    for t in trajs:  # every token the engine ran through the model; the last one of each response never ran
        assert t.experts.shape == (t.prompt_ids.numel() + t.response_length, layers, 2)
        assert t.experts.dtype == torch.uint8
        ran = t.experts[:-1]
        assert bool((ran < 4).all()) and int(t.experts[-1, 0, 0]) == missing_code(torch.uint8)
    worst, metrics = gap(model, trajs, laid_out(trajs, tok, layout), replay=True)
    assert worst < 2e-5
    assert metrics == {"moe/replay_tokens": 1.0, "moe/routing_mismatch": 0.0}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_replay_undoes_a_router_choice_that_flipped_between_rollout_and_training(arch, layout):
    """The tie test: the engine's model has tied experts; the trainer's differs by a relative 1e-6 in the
    routers (as two engines' rounding would), which flips the tied choice for some tokens. Without replay the
    flipped tokens' logprobs move by much more than the nudge; with it, by about the nudge."""
    model, tok = moe_model(arch)
    trajs = rollout(tied(model), tok)
    trainer = nudged(model)
    batch = laid_out(trajs, tok, layout)
    without, _ = gap(trainer, trajs, batch, replay=False)
    with_replay, metrics = gap(trainer, trajs, batch, replay=True)
    assert without > 1e-2 and with_replay < 1e-5
    assert metrics["moe/replay_tokens"] == 1.0 and 0.0 < metrics["moe/routing_mismatch"] < 0.5


def test_the_engine_records_what_a_full_forward_routes():
    """The engine's experts (prefill once for a shared prefix and per prompt, then one decode step per
    token) are the routers' choices in one forward of the whole sequence."""
    model, tok = tiny_model_and_tokenizer(seed=0, arch="qwen3_moe")
    trajs = rollout(model, tok)
    batch = collate(trajs, tok.pad_token_id)
    with torch.no_grad(), record_routing(model) as routing:
        model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    full = torch.stack(routing.forwards[0].experts, dim=1).view(*batch.input_ids.shape, -1, 2)
    for b, t in enumerate(trajs):
        n = t.prompt_ids.numel() + t.response_length - 1
        assert torch.equal(full[b, :n].sort(-1).values, t.experts[:n].long().sort(-1).values)


def test_tokens_without_recorded_experts_keep_the_routers_own_choice():
    """Trajectories of an engine that records nothing (as vLLM's): the batch carries missing codes on the routed
    tokens (skip on padding and each sample's last token), the routers choose, nothing counts as replayed."""
    model, tok = tiny_model_and_tokenizer(seed=0, arch="mixtral")
    trajs = rollout(model, tok)
    bare = [replace(t, experts=None) for t in trajs]
    batch = collate([bare[0], *trajs[1:]], tok.pad_token_id)
    p, r = trajs[0].prompt_ids.numel(), trajs[0].response_length
    codes = batch.experts[0, :, 0, 0].tolist()
    assert codes[: p + r - 1] == [missing_code(torch.uint8)] * (p + r - 1)
    assert set(codes[p + r - 1 :]) == {skip_code(torch.uint8)}
    assert collate(bare, tok.pad_token_id).experts is None
    worst, metrics = gap(model, trajs, batch, replay=True)
    assert worst < 2e-5 and 0.0 < metrics["moe/replay_tokens"] < 1.0


def test_a_dense_model_records_and_replays_nothing():
    model, tok = tiny_model_and_tokenizer(seed=0)
    engine = HFEngine(model, tok, record_experts=True)
    assert engine.recorder is None
    assert all(t.experts is None for t in engine.generate([[5, 6, 7]], PARAMS))
    assert replayable_routers(model) == []


def test_replayed_experts_that_do_not_fit_the_forward_are_refused():
    model, tok = tiny_model_and_tokenizer(seed=0, arch="qwen3_moe")
    trajs = rollout(model, tok)
    batch = collate(trajs, tok.pad_token_id)
    with (pytest.raises(TrainingError, match="routes .* tokens and the recorded experts cover"),
          replay_routing(model, batch.experts[:, :-1])):
        response_logprobs(model, batch)
    with pytest.raises(TrainingError, match="records 1 MoE layers"), replay_routing(model, batch.experts[:, :, :1]):
        pass


@pytest.mark.parametrize("keep_turns", [True, False], ids=["kept_turns", "full_prefills"])
def test_agent_episodes_carry_the_experts_of_every_turn(keep_turns):
    """Multi-turn episodes: each token keeps the experts of the forward that first computed it (a kept turn's
    tokens are not computed again); only the feedback after the last action was never run. The tie test on
    the episodes: replay undoes the flips on every action token."""
    model, tok = tiny_model_and_tokenizer(seed=0, arch="qwen3_moe")
    engine = HFEngine(tied(model), tok, keep_turns=keep_turns, record_experts=True)
    prompts = [TextPrompt(tok, "What is 2+3?"), TextPrompt(tok, "Hello there, how are you?")]
    trajs = MultiTurnExecutor(FeedbackAgent).run(engine, tok, prompts, SamplingParams(max_new_tokens=5, temperature=1.0,
                                                                                  n=2), TokenBudget(5, 60, 3),
                                             seeds=[1, 2])
    assert all(t.info["turns"] == 3 for t in trajs)
    for t in trajs:
        last_action = int(t.loss_mask.nonzero()[-1])
        ran = t.experts[: t.prompt_ids.numel() + last_action]
        assert bool((ran < 4).all())  # every token before the last action: recorded
        assert set(t.experts[t.prompt_ids.numel() + last_action + 1 :, 0, 0].tolist()) <= {missing_code(torch.uint8)}
    batch = collate(trajs, tok.pad_token_id)
    trainer = nudged(model)
    without, _ = gap(trainer, trajs, batch, replay=False)
    with_replay, metrics = gap(trainer, trajs, batch, replay=True)
    assert without > 1e-2 and with_replay < 1e-5 and metrics["moe/replay_tokens"] == 1.0


def test_tool_executor_episodes_carry_the_experts_of_every_turn():
    """A text environment's episodes through the tool executor (its turns batched as they come): the same
    bookkeeping as the multi-turn executor's, and the tie test on them."""
    from transformers import AutoModelForCausalLM

    from rlhfkit.agents.textenv import text_env
    from rlhfkit.agents.tools.agent import ToolExecutor
    from rlhfkit.models.tiny import tiny_config
    from tests.unit.agents.conftest import char_tokenizer
    from tests.unit.agents.test_executor_kept_turns import TalkEnv

    tok = char_tokenizer()
    config = tiny_config("qwen3_moe", layers=3)
    config.vocab_size, config.pad_token_id, config.eos_token_id, config.bos_token_id = len(tok), tok.pad_token_id, \
        None, None
    torch.manual_seed(0)
    model = tied(AutoModelForCausalLM.from_config(config).eval())
    prompt = type("P", (), {"text": "Play.", "raw": "Play.", "label": None, "ids": [], "record": None})()
    executor = ToolExecutor(environment_factory=text_env(TalkEnv), overlap=True)
    trajs = executor.run(HFEngine(model, tok, record_experts=True), tok, [prompt, prompt],
                         SamplingParams(max_new_tokens=5, temperature=1.0), TokenBudget(5, 200, 3), seeds=[3, 4])
    assert all(t.info["turns"] == 3 for t in trajs)
    for t in trajs:
        assert bool((t.experts[: t.prompt_ids.numel() + int(t.loss_mask.nonzero()[-1])] < 4).all())
    batch = collate(trajs, tok.pad_token_id)
    without, _ = gap(nudged(model), trajs, batch, replay=False)
    with_replay, metrics = gap(nudged(model), trajs, batch, replay=True)
    assert without > 1e-2 and with_replay < 1e-5 and metrics["moe/replay_tokens"] == 1.0


def _two_expert_block(arch):
    """A 2-expert, top-1 MoE block without normalisation (so its weight is the router's probability) and a
    batch of 6 token states, each replayed onto the expert its router did NOT choose."""
    over = {"num_experts": 2} if arch == "qwen3_moe" else {"n_routed_experts": 2}
    model, _ = tiny_model_and_tokenizer(seed=0, arch=arch, num_experts_per_tok=1, norm_topk_prob=False, **over)
    router = replayable_routers(model)[-1]
    block = next(m for m in model.modules() if getattr(m, "gate", None) is router)
    h = torch.randn(6, router.weight.shape[1], generator=torch.Generator().manual_seed(1))
    own = router(h)[2]
    codes = torch.zeros(1, 6, len(replayable_routers(model)), 1, dtype=torch.uint8)
    codes[0, :, -1] = (1 - own).to(torch.uint8)  # the other expert (own: [6, 1])
    return model, block, router, h, codes


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_the_router_gets_the_gradient_of_the_recomputed_weights_by_hand(arch):
    """out_n = w_n * E_e(h_n) (+ a shared expert) with e the replayed expert and w_n its weight:
    softmax: w = p_e,         d w / d W = p_e (onehot_e - p) h^T;
    sigmoid: w = s_e scale,   d w / d W = scale s_e (1 - s_e) onehot_e h^T.
    With L = sum(g * out): d L / d W = sum_n (g_n . E_e(h_n)) d w_n / d W."""
    model, block, router, h, codes = _two_expert_block(arch)
    g = torch.randn(6, h.shape[1], generator=torch.Generator().manual_seed(2))
    with replay_routing(model, codes):
        out = block(h.unsqueeze(0)).squeeze(0)
    (out * g).sum().backward()
    e = codes[0, :, -1, 0].long()
    with torch.no_grad():
        expert_out = block.experts(h, e.unsqueeze(-1), torch.ones(6, 1))  # E_e(h_n), weight 1
        c = (g * expert_out).sum(-1)  # [6]
        logits = h @ router.weight.T
        onehot = torch.nn.functional.one_hot(e, 2).float()
        if arch == "qwen3_moe":
            p = logits.softmax(-1)
            dw_dlogits = p.gather(1, e[:, None]) * (onehot - p)
        else:
            s = logits.sigmoid().gather(1, e[:, None])
            dw_dlogits = router.routed_scaling_factor * s * (1 - s) * onehot
        want = (c[:, None] * dw_dlogits).T @ h  # [2, H]
    assert float(router.weight.grad.abs().max()) > 1e-4
    torch.testing.assert_close(router.weight.grad, want, rtol=1e-4, atol=1e-6)


def rl_step(arch, replay: bool, checkpointing: bool = False):
    """One RL step (2 epochs: the old-logprob pass runs) of the nudged policy on the tied engine's samples;
    returns its metrics and the policy's parameters after it."""
    from rlhfkit.agents.executor import SingleTurnExecutor
    from rlhfkit.api import builder
    from rlhfkit.config import RL_ALIASES, RLConfig, parse_config, validate
    from rlhfkit.config.plan import plan_run
    from rlhfkit.data.types import PromptItem
    from rlhfkit.models.precision import enable_gradient_checkpointing
    from rlhfkit.rewards.base import RewardOutput

    def reward(queries, prompts, labels, **kw):
        scores = torch.tensor([float(q.count("7")) for q in queries])
        return RewardOutput(scores, scores)

    model, tok = moe_model(arch)
    policy = nudged(tied(model))
    if checkpointing:
        enable_gradient_checkpointing(policy)
    argv = ["--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "8",
            "--rollout.temperature", "1.0", "--train.batch_size", "4", "--train.micro_batch_size", "2",
            "--train.max_epochs", "2", "--actor.autocast", "none", "--algo.advantage.estimator", "group_norm",
            "--train.num_episodes", "1", "--actor.routing_replay", str(replay).lower()]
    cfg = parse_config(RLConfig, argv, aliases=RL_ALIASES)
    prompts = [PromptItem(p, tok(p, add_special_tokens=False)["input_ids"], "") for p in PROMPTS[:2]]
    engine = HFEngine(model, tok, record_experts=cfg.actor.routing_replay)  # the tied model samples
    loop = builder.build_loop(cfg, plan_run(cfg, validate(cfg), len(prompts)), policy, tok, engine, reward,
                              builder.prompt_stream(cfg, prompts), SingleTurnExecutor())
    (metrics,) = loop.train()
    return metrics, {k: v.detach().clone() for k, v in policy.named_parameters()}


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_an_rl_step_replays_the_engines_experts_in_the_old_logprob_pass_and_the_update(arch):
    plain, _ = rl_step(arch, replay=False)
    metrics, _ = rl_step(arch, replay=True)
    assert plain["rollout/logprob_gap_max"] > 1e-2 and metrics["rollout/logprob_gap_max"] < 1e-5  # old vs rollout
    assert "moe/replay_tokens" not in plain
    assert metrics["moe/replay_tokens"] == pytest.approx(1.0) and metrics["moe/routing_mismatch"] > 0.0


def test_gradient_checkpointing_recomputes_the_replayed_routing_in_backward():
    """The backward's recomputation routes as the forward did: the same update with and without checkpointing."""
    _, plain = rl_step("mixtral", replay=True)
    _, checkpointed = rl_step("mixtral", replay=True, checkpointing=True)
    for name, value in plain.items():
        torch.testing.assert_close(checkpointed[name], value, rtol=1e-4, atol=1e-6)


def test_a_rollout_worker_records_the_experts_across_partial_rollout_slices(tmp_path):
    """A Ray rollout worker's engine (here in this process) records them too, through generations resumed in
    slices of 3 tokens; the trainer's replay then gives the worker's logprobs."""
    from rlhfkit.distributed.worker import RolloutWorker

    model, tok = moe_model("mixtral")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    worker = RolloutWorker(str(tmp_path), None, "float32", None, None, partial_tokens=3, record_experts=True)
    worker.update_weights(model.state_dict(), 0)
    trajs = worker.generate([tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS], PARAMS, seeds=[1, 2, 3])
    assert all(bool((t.experts[:-1] < 4).all()) for t in trajs)
    worst, metrics = gap(model, trajs, collate(trajs, tok.pad_token_id), replay=True)
    assert worst < 2e-5 and metrics["moe/replay_tokens"] == 1.0
