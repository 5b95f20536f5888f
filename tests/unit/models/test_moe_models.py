"""Mixture-of-experts models (tiny Qwen3-MoE, Mixtral, DeepSeek-V3 built in code): every advantage
estimator trains them, their routers are recorded through rlhfkit's forward (the load-balancing loss is
transformers' aux_loss of the same tokens), and --aux_loss_coef adds that loss to the supervised and
RL losses. (The other layouts and fast paths: test_architectures.py, which runs these models too.)"""

import pytest
import torch

from rlhfkit.agents.executor import SingleTurnExecutor
from rlhfkit.api import builder
from rlhfkit.config import RL_ALIASES, RLConfig, parse_config, validate
from rlhfkit.config.plan import plan_run
from rlhfkit.config.rl import ADVANTAGE_ESTIMATORS
from rlhfkit.config.sft import SFTConfig
from rlhfkit.data.batch import collate
from rlhfkit.data.supervised import TokenSample
from rlhfkit.data.types import PromptItem
from rlhfkit.models import Critic, response_logprobs
from rlhfkit.models.moe import moe_top_k, record_routing, router_modules, routing_loss
from rlhfkit.models.tiny import MOE_ARCHITECTURES, tiny_model_and_tokenizer
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.trainers.supervised.sft import SFTLoop

PROMPTS = ["hello world, this is", "2+3="]


def reward(queries, prompts, labels, **kw):
    scores = torch.tensor([float(q.count("7")) for q in queries])
    return RewardOutput(scores, scores)


def samples(tok):
    return [TokenSample(torch.tensor(tok(p, add_special_tokens=False)["input_ids"]),
                        torch.tensor(tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]),
                        torch.ones(len(r) + 1, dtype=torch.bool)) for p, r in [("a=", "cat"), ("bb=", "dog!")]]


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_the_routers_are_found_and_recorded_through_rlhfkits_forward(arch):
    model, tok = tiny_model_and_tokenizer(seed=0, arch=arch)
    layers = {"qwen3_moe": 2, "mixtral": 2, "deepseek_v3": 1}[arch]  # DeepSeek-V3's first layer is dense
    assert moe_top_k(model) == 2 and len(router_modules(model)) == layers
    batch = collate(samples(tok), tok.pad_token_id)
    with record_routing(model) as routing:
        response_logprobs(model, batch)
    (fwd,) = routing.forwards
    assert len(fwd.logits) == layers and fwd.mask.tolist() == batch.attention_mask.reshape(-1).bool().tolist()
    assert all(e.shape == (batch.input_ids.numel(), 2) for e in fwd.experts)
    if arch != "deepseek_v3":  # transformers computes no aux_loss for DeepSeek-V3 (its balance is a bias)
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_router_logits=True)
        aux, metrics = routing_loss(routing)
        torch.testing.assert_close(aux, out.aux_loss.float(), rtol=1e-5, atol=1e-6)
        assert 1.0 <= float(metrics["moe/load_max"]) <= 4.0
    dense, _ = tiny_model_and_tokenizer(seed=0)
    with record_routing(dense) as none:
        assert none is None and moe_top_k(dense) is None


def test_routing_is_recorded_per_forward_where_get_decoder_is_the_lm_itself():
    # Llama 4's text model: get_decoder() gives the LM, the logprobs call its `model`: one Forward (with the
    # batch's mask) per call, as for the other MoE models
    model, tok = tiny_model_and_tokenizer(seed=0, arch="llama4_text")
    assert model.get_decoder() is model and router_modules(model)
    batch = collate(samples(tok), tok.pad_token_id)
    with record_routing(model) as routing:
        response_logprobs(model, batch)
        response_logprobs(model, batch)
    mask = batch.attention_mask.reshape(-1).bool().tolist()
    assert [f.mask.tolist() for f in routing.forwards] == [mask, mask]


def sft_losses(arch, coef):
    model, tok = tiny_model_and_tokenizer(seed=0, arch=arch)
    cfg = parse_config(SFTConfig, ["--train.batch_size", "2", "--train.micro_batch_size", "1",
                                   "--model.aux_loss_coef", str(coef)])
    loop = SFTLoop(cfg, model, tok, samples(tok))
    seen = []
    loop.learner.backward = lambda loss: seen.append(float(loss))  # the losses the loop backpropagates
    metrics = loop.loop.optimizer_step(loop.micro_loss, loop.loop.items)
    return seen, metrics


@pytest.mark.parametrize("arch", ["mixtral", "deepseek_v3"])
def test_aux_loss_coef_adds_the_load_balancing_loss_to_each_sft_micro_batch(arch):
    plain, m0 = sft_losses(arch, 0.0)
    with_aux, m1 = sft_losses(arch, 0.5)
    assert m0["moe/aux_loss"] == pytest.approx(m1["moe/aux_loss"]) and m1["moe/aux_loss"] > 0.5
    # each micro-batch (half of the step) adds 0.5 x its aux loss x 1/2; the metric is their mean
    assert sum(with_aux) - sum(plain) == pytest.approx(0.5 * m1["moe/aux_loss"], rel=1e-5)
    assert m1["loss"] == pytest.approx(m0["loss"])  # the SFT loss itself is logged without it


def rl_step(arch, estimator, coef=0.0):
    model, tok = tiny_model_and_tokenizer(seed=0, arch=arch)
    argv = ["--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "5",
            "--rollout.temperature", "1.0", "--train.batch_size", "4", "--train.micro_batch_size", "2",
            "--actor.autocast", "none", "--algo.advantage.estimator", estimator, "--algo.kl.init_coef", "0.01",
            "--train.num_episodes", "1", "--actor.aux_loss_coef", str(coef)]
    cfg = parse_config(RLConfig, argv, aliases=RL_ALIASES)
    prompts = [PromptItem(p, tok(p, add_special_tokens=False)["input_ids"], "") for p in PROMPTS]
    critic = Critic.from_causal_lm(model) if estimator == "gae" else None
    loop = builder.build_loop(cfg, plan_run(cfg, validate(cfg), len(prompts)), model, tok, HFEngine(model, tok), reward,
                              builder.prompt_stream(cfg, prompts), SingleTurnExecutor(),
                              ref=tiny_model_and_tokenizer(seed=0, arch=arch)[0], critic=critic)
    return model, loop


@pytest.mark.parametrize("estimator", ADVANTAGE_ESTIMATORS)
@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_every_estimator_trains_a_moe_policy_with_its_expert_load_logged(arch, estimator):
    model, loop = rl_step(arch, estimator, coef=0.01)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    (metrics,) = loop.train()
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values() if isinstance(v, float))
    assert metrics["moe/aux_loss"] > 0 and 1.0 <= metrics["moe/load_max"] <= 4.0
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_aux_loss_coef_adds_the_load_balancing_loss_in_rl():
    seen = {}
    for coef in (0.0, 0.3):
        _, loop = rl_step("qwen3_moe", "group_norm", coef)
        losses = seen[coef] = []
        learner = loop.update.learner
        learner.backward = lambda loss, out=losses: out.append(float(loss))
        (metrics,) = loop.train()
    aux = metrics["moe/aux_loss"]  # the mean over the step's micro-batches
    assert sum(seen[0.3]) - sum(seen[0.0]) == pytest.approx(0.3 * aux, rel=1e-4)
