"""Every architecture of `models.tiny.ARCHITECTURES` (random 2-layer models built in code)
through rlhfkit: the HF engine's greedy rollout is `model.generate`'s, rollout logprobs are the
trainer's forward and both are plain transformers' numbers, the shared-prefix and packed layouts
give the padded layout's logprobs and gradients, and one RL step (PPO with critic and reference)
and one SFT step run. Where an architecture cannot take a fast path, the plain path runs with a
note; the tests compare numbers, so a wrong fast path fails them."""

import copy
import logging

import pytest
import torch

from rlhfkit.agents.executor import SingleTurnExecutor
from rlhfkit.api import builder
from rlhfkit.config import RL_ALIASES, RLConfig, parse_config, validate
from rlhfkit.config.plan import plan_run
from rlhfkit.config.sft import SFTConfig
from rlhfkit.data.batch import collate, select_rows
from rlhfkit.data.packing import pack, pack_shared_prefix
from rlhfkit.data.supervised import TokenSample
from rlhfkit.data.types import PromptItem, Trajectory
from rlhfkit.models import Critic, response_logprobs
from rlhfkit.models import logprobs as logprobs_module
from rlhfkit.models.tiny import ARCHITECTURES, SLIDING_WINDOW, tiny_model_and_tokenizer
from rlhfkit.rewards.base import RewardOutput
from rlhfkit.rollout.base import SamplingParams
from rlhfkit.rollout.hf import HFEngine
from rlhfkit.trainers.supervised.sft import SFTLoop

ARCHS = list(ARCHITECTURES)
PROMPTS = ["hello world, this is", "2+3=", "abc def ghi"]

# What each architecture cannot take, by the note it logs (the other fast paths it takes).
NOTES = {
    "mistral": ["sliding window (8 tokens) is narrower than a shared-prefix row"],
    "gemma2": ["final_logit_softcapping=3.0 transforms the logits", "sliding window (8 tokens)"],
    "gemma3": ["sliding window (8 tokens)"],
    "phi": ["LM head has a bias"],
    "granite": ["logits_scaling=4.0 transforms the logits"],
    "lfm2": ["layers other than attention (LinearAttentionLayer)"],
    "bloom": ["forward takes no position_ids"],
    "rwkv": ["forward takes no past_key_values", "forward takes no position_ids"],
    "falcon": ["causal mask is built without position_ids"],
    "falcon_h1": ["layers other than attention (LinearAttentionAndFullAttentionLayer)",
                  "lm_head_multiplier=0.5 transforms the logits"],
    "qwen3_next": ["layers other than attention (LinearAttentionLayer)"],
    "gpt_oss": ["causal mask is built without position_ids", "sliding window (8 tokens)"],
    "modernbert_decoder": ["its logits are not lm_head(last hidden state)"],  # a dense + norm head before it
    "roberta": ["its logits are not lm_head(last hidden state)", "causal mask is built without position_ids"],
    "trocr": ["forward takes no position_ids"],  # (and left padding changes its numbers: one prompt at a time)
    "deepseek_v4": ["attention mask is not built by transformers' masking_utils"],  # (and left padding)
}


@pytest.fixture(autouse=True)
def fresh_notes():
    """Notes are logged once per process: forget them so each test sees its own."""
    logprobs_module.note_once.cache_clear()
    yield


def model_for(arch, **overrides):
    model, tok = tiny_model_and_tokenizer(seed=0, arch=arch, **overrides)
    return model, tok, [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]


def plain_logprobs(model, traj, temperature=1.0):
    """Logprobs of traj's response under transformers' own forward of the unpadded sequence."""
    full = torch.cat([traj.prompt_ids, traj.response_ids]).unsqueeze(0)
    with torch.no_grad():
        logits = model(full).logits[0].float() / temperature
    p = traj.prompt_ids.numel()
    return torch.log_softmax(logits[p - 1 : -1], -1).gather(-1, traj.response_ids[:, None])[:, 0]


# ---------------------------------------------------------------------- rollout


# transformers' generate numbers a RoBERTa decoder's positions from 0, its forward from pad_token_id + 1: the
# engine follows the forward (the sampled-rollout test below compares them)
@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "roberta"])
def test_greedy_rollout_is_generate_with_its_stop_tokens(arch):
    model, tok, prompts = model_for(arch)
    max_new = 10
    free = model.generate(torch.tensor([prompts[0]]), do_sample=False, max_new_tokens=max_new,
                          pad_token_id=tok.pad_token_id)[0, len(prompts[0]):]
    stop = int(free[3])  # a stop token that prompt 0 reaches within the budget (the others may too)
    engine = HFEngine(model, tok)
    trajs = engine.generate(prompts, SamplingParams(max_new_tokens=max_new, temperature=0.0, n=2,
                                                    stop_token_ids=(stop,)))
    assert trajs[0].finish_reason == "stop" and len(trajs[0].response_ids) <= 4
    for i, p in enumerate(prompts):
        out = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=max_new, pad_token_id=tok.pad_token_id,
                             eos_token_id=[tok.eos_token_id, stop], output_logits=True, return_dict_in_generate=True)
        want = out.sequences[0, len(p):]
        want_lp = torch.stack([torch.log_softmax(z[0].float(), -1)[t] for z, t in zip(out.logits, want)])
        for t in trajs[2 * i : 2 * i + 2]:  # both greedy samples of the prompt
            assert t.response_ids.tolist() == want.tolist(), (arch, i)
            assert t.finish_reason == ("stop" if int(want[-1]) in (tok.eos_token_id, stop) else "length")
            torch.testing.assert_close(t.logprobs, want_lp, atol=2e-5, rtol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_sampled_rollout_logprobs_are_the_trainers_and_transformers_forward(arch):
    model, tok, prompts = model_for(arch)
    engine = HFEngine(model, tok)
    trajs = engine.generate(prompts, SamplingParams(max_new_tokens=12, temperature=0.8, n=2),
                            generator=torch.Generator().manual_seed(0))
    batch = collate(trajs, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch, temperature=0.8)
    for b, t in enumerate(trajs):
        r = len(t.response_ids)
        torch.testing.assert_close(logp[b, :r], t.logprobs, atol=2e-5, rtol=0)
        torch.testing.assert_close(logp[b, :r], plain_logprobs(model, t, 0.8), atol=2e-5, rtol=0)


# ---------------------------------------------------------------------- training layouts


def traj(prompt, response, group_id):
    r = torch.tensor(response, dtype=torch.long)
    return Trajectory(prompt_ids=torch.tensor(prompt, dtype=torch.long), response_ids=r,
                      loss_mask=torch.ones(len(r), dtype=torch.bool), logprobs=torch.zeros(len(r)),
                      finish_reason="stop", version=0, group_id=group_id)


def random_trajs(seed=1):
    """3 prompts x 3 samples; rows of up to ~30 tokens (wider than SLIDING_WINDOW)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for gid in range(3):
        p = torch.randint(5, 60, (int(torch.randint(3, 10, (1,), generator=g)),), generator=g).tolist()
        for _ in range(3):
            n = int(torch.randint(2, 9, (1,), generator=g))
            out.append(traj(p, torch.randint(5, 60, (n,), generator=g).tolist(), gid))
    return out


def logprobs_and_grads(model, batch):
    model.zero_grad()
    logp, ent = response_logprobs(model, batch, temperature=0.7, with_entropy=True)
    m = batch.loss_mask
    ((logp * m).sum() + (ent * m).sum()).backward()
    # a parameter no token reaches (an expert no token is routed to) has no gradient: zeros in every layout
    return logp[m].detach(), [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefix_and_packed_layouts_equal_the_padded_one(arch, caplog):
    model, _, _ = model_for(arch)
    trajs = random_trajs()
    batch, rows = collate(trajs, 0), torch.arange(len(trajs))
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        lp_pad, g_pad = logprobs_and_grads(model, select_rows(batch, rows))
        for layout in (pack_shared_prefix(batch, rows, 0, 512), pack(trajs, 0)):
            lp, g = logprobs_and_grads(model, layout)
            torch.testing.assert_close(lp, lp_pad, atol=2e-5, rtol=1e-5)
            for a, b in zip(g, g_pad, strict=True):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # the padded logprobs are transformers' own
    want = torch.cat([plain_logprobs(model, t, 0.7) for t in trajs])
    torch.testing.assert_close(lp_pad, want, atol=2e-5, rtol=0)
    for note in NOTES.get(arch, []):
        if "cache" not in note and "past_key_values" not in note:  # the engine's notes come with a rollout
            assert note in caplog.text, (arch, note, caplog.text)
    if arch not in NOTES:
        assert caplog.text == ""  # every fast path taken


@pytest.mark.parametrize("eager_rows", [logprobs_module.EAGER_ROW_TOKENS, 0])
@pytest.mark.parametrize("arch", ARCHS)
def test_rows_by_length_with_uneven_responses_equal_the_padded_layout(arch, eager_rows, monkeypatch):
    """Responses of 1 to 20 tokens: rows filled by length hold several prompts, the LM head runs at
    the response tokens only; logprobs and gradients are the padded layout's (or, where a model
    cannot take the 4-D mask, the layout runs as padded rows). eager_rows 0: the 4-D mask under the
    model's own attention (SDPA), as rows wider than EAGER_ROW_TOKENS run on CPU."""
    monkeypatch.setattr(logprobs_module, "EAGER_ROW_TOKENS", eager_rows)
    model, _, prompts = model_for(arch)
    trajs = [traj(prompts[g], [5 + (7 * g + 3 * i + j) % 50 for j in range(n)], g)
             for g, lengths in enumerate([[20, 1, 2], [1, 1, 15], [3, 3, 3]]) for i, n in enumerate(lengths)]
    batch, rows = collate(trajs, 0), torch.randperm(len(trajs), generator=torch.Generator().manual_seed(0))
    sp = pack_shared_prefix(batch, rows, 0, 16)
    assert sp.input_ids.shape[0] < pack_shared_prefix(batch, rows, 0, 16, by_length=False).input_ids.shape[0]
    lp_pad, g_pad = logprobs_and_grads(model, select_rows(batch, rows))
    lp, g = logprobs_and_grads(model, sp)
    torch.testing.assert_close(lp, lp_pad, atol=2e-5, rtol=1e-5)
    for a, b in zip(g, g_pad, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ["mistral", "gemma2", "gemma3"])
def test_a_sliding_window_wider_than_the_rows_keeps_the_shared_prefix(arch):
    model, _, _ = model_for(arch, sliding_window=64)
    trajs = random_trajs()
    batch, rows = collate(trajs, 0), torch.arange(len(trajs))
    sp = pack_shared_prefix(batch, rows, 0, 512)
    assert logprobs_module.layout_blocker(model, sp) is None  # the 4-D mask is used
    lp_pad, g_pad = logprobs_and_grads(model, select_rows(batch, rows))
    lp, g = logprobs_and_grads(model, sp)
    torch.testing.assert_close(lp, lp_pad, atol=2e-5, rtol=1e-5)
    for a, b in zip(g, g_pad, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    narrow, _, _ = model_for(arch)
    assert "narrower" in logprobs_module.layout_blocker(narrow, sp)
    assert SLIDING_WINDOW < sp.input_ids.shape[1] <= 64


@pytest.mark.parametrize("arch", ["llama", "gpt2", "rwkv", "lfm2", "llama4_text", "modernbert_decoder"])
def test_critic_values_equal_the_padded_layout(arch):
    model, _, _ = model_for(arch)
    critic = Critic.from_causal_lm(model)
    torch.nn.init.normal_(critic.value_head.weight, generator=torch.Generator().manual_seed(0))
    trajs = random_trajs(2)
    batch, rows = collate(trajs, 0), torch.arange(len(trajs))
    pad = select_rows(batch, rows)
    with torch.no_grad():
        want = critic.response_values(pad)[pad.response_mask]
        for layout in (pack_shared_prefix(batch, rows, 0, 512), pack(trajs, 0)):
            torch.testing.assert_close(critic.response_values(layout)[layout.response_mask], want, atol=1e-5, rtol=1e-5)


def test_a_model_whose_forward_changes_the_logits_after_its_head_takes_the_plain_path(caplog):
    """No config field says so: the probe of the model's own forward finds it."""
    from transformers import LlamaForCausalLM

    class Scaled(LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 1.5
            return out

    base, _, _ = model_for("llama")
    model = Scaled(base.config)
    model.load_state_dict(base.state_dict())
    trajs = random_trajs()
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        logp, _ = response_logprobs(model, collate(trajs, 0), temperature=0.7)
    assert logprobs_module.split_backbone(model) is None and "not lm_head(last hidden state)" in caplog.text
    got = logp[collate(trajs, 0).response_mask]
    torch.testing.assert_close(got, torch.cat([plain_logprobs(model, t, 0.7) for t in trajs]), atol=2e-5, rtol=0)
    assert logprobs_module.split_backbone(base) is not None  # the same weights without the scale: fused


# ---------------------------------------------------------------------- one RL step, one SFT step


def reward(queries, prompts, labels, **kwargs):
    scores = torch.tensor([float(len(q) % 3) for q in queries])
    return RewardOutput(scores, scores)


@pytest.mark.parametrize("arch", ARCHS)
def test_one_ppo_step_with_critic_and_reference_and_one_sft_step(arch):
    model, tok, _ = model_for(arch)
    argv = ["--rollout.batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "6",
            "--rollout.temperature", "1.0", "--train.batch_size", "4", "--train.micro_batch_size", "2",
            "--actor.autocast", "none", "--algo.advantage.estimator", "gae", "--algo.kl.init_coef", "0.01",
            "--train.num_episodes", "1"]
    cfg = parse_config(RLConfig, argv, aliases=RL_ALIASES)
    prompts = [PromptItem(p, tok(p, add_special_tokens=False)["input_ids"], "") for p in PROMPTS[:2]]
    before = copy.deepcopy(model.state_dict())
    critic = Critic.from_causal_lm(model)
    counts = plan_run(cfg, validate(cfg), len(prompts))
    loop = builder.build_loop(cfg, counts, model, tok, HFEngine(model, tok), reward,
                              builder.prompt_stream(cfg, prompts), SingleTurnExecutor(),
                              ref=copy.deepcopy(model).eval(), critic=critic)
    history = loop.train()
    assert loop.step == 1 and len(history) == 1
    assert all(torch.isfinite(torch.tensor(v)).all() for v in history[0].values() if isinstance(v, float))
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # the policy moved
    assert critic.value_head.weight.abs().sum() > 0  # and the critic

    samples = [TokenSample(torch.tensor(tok(f"{k}=", add_special_tokens=False)["input_ids"]),
                           torch.tensor(tok(v, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]),
                           torch.ones(len(v) + 1, dtype=torch.bool)) for k, v in [("a", "cat"), ("bb", "dog!")]]
    sft_cfg = parse_config(SFTConfig, ["--train.batch_size", "2", "--train.micro_batch_size", "1",
                                       "--ds.packing_samples", "true", "--train.max_steps", "1",
                                       "--train.lr_warmup_ratio", "0"])  # a warmup's first step has lr 0
    trainer = SFTLoop(sft_cfg, model, tok, samples)
    before = copy.deepcopy(model.state_dict())
    (metrics,) = trainer.fit()
    assert 0 < metrics["loss"] < 20 and trainer.loop.step == 1
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


# ---------------------------------------------------------------------- the engine's fast parts


@pytest.mark.parametrize("arch", ["rwkv"])
def test_a_model_without_a_copyable_kv_cache_decodes_without_one(arch, caplog):
    model, tok, prompts = model_for(arch)
    with caplog.at_level(logging.INFO, logger="rlhfkit"):
        engine = HFEngine(model, tok, max_batch_size=64)
    assert not engine._cached and "without a KV cache" in caplog.text
    assert [list(c) for c in engine._chunks(prompts, SamplingParams(n=2))] == [[0, 1], [1, 2], [2, 3]]


@pytest.mark.parametrize("arch", ["lfm2", "falcon_h1", "qwen3_next"])
def test_convolution_and_recurrent_states_are_cached_and_copied_per_sample(arch):
    """Short-convolution, Mamba and gated-DeltaNet layers keep their states in the engine's cache: one
    prefill for the n samples of a prompt (its states repeated per row), finished rows dropped; the
    samples are those of the cacheless decode (which runs the whole sequence at every step)."""
    model, tok, prompts = model_for(arch)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=3)
    cached = HFEngine(model, tok)
    assert cached._cached
    uncached = HFEngine(model, tok)
    uncached._cached = False
    seeds = [11, 12, 13]  # per-prompt draws: the same whether the prompts decode together or one by one
    for got, want in zip(cached.generate(prompts, params, seeds=seeds), uncached.generate(prompts, params, seeds=seeds),
                         strict=True):
        assert got.response_ids.tolist() == want.response_ids.tolist()
        torch.testing.assert_close(got.logprobs, want.logprobs, atol=2e-5, rtol=0)
    assert cached.prefilled_tokens == sum(map(len, prompts))  # one prefill per prompt, not per sample


def test_grouped_decode_attention_with_a_value_width_other_than_the_query_width():
    """(Multi-head latent attention has Dv != D.) Against eager attention's formula."""
    from rlhfkit.rollout.decode_attention import cpu_decode_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 4, 1, 8, generator=g), torch.randn(3, 2, 5, 8, generator=g), torch.randn(3, 2, 5, 6,
                                                                                                      generator=g)
    mask = torch.ones(3, 1, 1, 5, dtype=torch.bool)
    mask[0, ..., :2] = False
    out, _ = cpu_decode_attention(None, q, k, v, mask, scaling=0.3)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ kk.transpose(-1, -2) * 0.3).masked_fill(~mask, torch.finfo(torch.float32).min)
    torch.testing.assert_close(out, (scores.softmax(-1) @ vv).transpose(1, 2), atol=1e-6, rtol=1e-6)


def test_soft_capped_attention_is_not_taken_by_the_grouped_decode(monkeypatch):
    from rlhfkit.rollout.decode_attention import cpu_decode_attention

    calls = []
    monkeypatch.setattr("transformers.integrations.sdpa_attention.sdpa_attention_forward",
                        lambda *a, **kw: calls.append(kw) or ("sdpa", None))
    q, k, v = torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4)
    assert cpu_decode_attention(None, q, k, v, None, softcap=50.0)[0] == "sdpa" and calls[0]["softcap"] == 50.0
    assert cpu_decode_attention(None, q, k, v, None, s_aux=torch.zeros(2))[0] == "sdpa"
    assert cpu_decode_attention(None, q, k, v, None, sliding_window=8)[0].shape == (1, 1, 2, 4)  # in the mask


def test_a_lora_wrapped_model_keeps_the_fast_layouts_and_the_engines_cache():
    """peft's forward takes **kwargs: the checks read the transformers model inside."""
    from rlhfkit.models.lora import add_lora

    model, tok, prompts = model_for("qwen2")
    lora = add_lora(model, 4, 8, ("q_proj", "v_proj"), 0.0)
    trajs = random_trajs()
    assert logprobs_module.layout_blocker(lora, pack(trajs, 0)) is None
    assert logprobs_module.layout_blocker(lora, pack_shared_prefix(collate(trajs, 0), torch.arange(9), 0, 512)) is None
    engine = HFEngine(lora, tok)
    assert engine._cached and engine._takes_positions
    got = engine.generate(prompts[:1], SamplingParams(max_new_tokens=5, temperature=0.0))[0].response_ids
    want = model.generate(torch.tensor(prompts[:1]), do_sample=False, max_new_tokens=5, pad_token_id=0)[0, -5:]
    assert got.tolist() == want.tolist()


def test_positions_are_numbered_as_the_models_own_forward_numbers_them():
    from rlhfkit.models.loading import position_limit, position_offset

    roberta, llama = model_for("roberta")[0], model_for("llama")[0]
    assert position_offset(roberta) == roberta.config.pad_token_id + 1 == 1 and position_offset(llama) == 0
    assert position_limit(roberta) == 511  # its table's first row is never reached


def test_packed_rows_only_where_the_causal_mask_is_built_from_the_position_ids():
    """The modeling files that call masking_utils without position_ids (directly, or through a mask
    function chosen by a variable, or a ** dict) are told apart from those that pass them."""
    import transformers

    from rlhfkit.models.logprobs import _masks_see_positions

    opt = transformers.OPTForCausalLM(transformers.OPTConfig(
        vocab_size=32, hidden_size=16, ffn_dim=32, num_hidden_layers=1, num_attention_heads=2,
        word_embed_proj_dim=16, max_position_embeddings=64))
    verdicts = {arch: _masks_see_positions(model_for(arch)[0])
                for arch in ("llama", "phi3", "mixtral", "gemma3", "falcon", "gpt_oss")}
    assert verdicts == {"llama": True, "phi3": True, "mixtral": True, "gemma3": True, "falcon": False,
                        "gpt_oss": False}
    assert not _masks_see_positions(opt)
