"""The supervised losses OpenRLHF's options change, against values computed by hand from a plain
forward: SFT in pretrain mode (every token), the reward model's margin, DPO + NLL."""

import json

import pytest
import torch
import torch.nn.functional as F

from rlhfkit.config.parse import parse_config
from rlhfkit.config.preference import DPOConfig, RMConfig
from rlhfkit.config.sft import SFTConfig
from rlhfkit.core.losses import dpo_loss, logprobs_from_logits
from rlhfkit.data.supervised import TextFormat, load_pairs, load_sft
from rlhfkit.errors import ConfigError
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.models.reward import init_reward_model
from rlhfkit.trainers.supervised.preference import DPOLoop, RMLoop
from rlhfkit.trainers.supervised.sft import SFTLoop


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_pretrain_mode_loss_is_the_causal_lm_loss_of_the_whole_text(tmp_path):
    """One text: the SFT loss in pretrain mode is transformers' own `labels=input_ids` loss (the mean
    NLL of every next token); on two texts, the token mean over both."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    f = write(tmp_path / "t.jsonl", [{"input": "hello world"}, {"input": "abc"}])
    samples, _ = load_sft(f, TextFormat(tok), pretrain_mode=True)
    cfg = parse_config(SFTConfig, ["--model.pretrain_mode_enable", "--train.batch_size", "2",
                                   "--train.micro_batch_size", "2"])
    loop = SFTLoop(cfg, model, tok, samples)
    texts = {"hello world": None, "abc": None}
    for t in texts:
        ids = torch.tensor([tok(t, add_special_tokens=False)["input_ids"]])
        texts[t] = (model(input_ids=ids, labels=ids).loss, ids.shape[1] - 1)
    by_text = {tok.decode(torch.cat([s.prompt_ids, s.response_ids]).tolist()): s for s in samples}
    one = [by_text["hello world"]]
    loss, _ = loop.micro_loss(one, one)
    torch.testing.assert_close(loss, texts["hello world"][0], rtol=1e-5, atol=1e-6)
    both, _ = loop.micro_loss(samples, samples)
    (l1, n1), (l2, n2) = texts.values()
    torch.testing.assert_close(both, (l1 * n1 + l2 * n2) / (n1 + n2), rtol=1e-5, atol=1e-6)


def test_dft_loss_weights_each_target_token_by_its_probability(tmp_path):
    """--model.loss_type dft: the micro-batch loss is the token mean of p * NLL (p detached) over the same
    response tokens as the NLL; nll (the default) is the plain token mean."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    samples, _ = load_sft(write(tmp_path / "t.jsonl", [{"input": "q: 2+2", "output": "4 ok"}]), TextFormat(tok))
    losses = {}
    for kind in ("nll", "dft"):
        cfg = parse_config(SFTConfig, ["--model.loss_type", kind, "--train.batch_size", "1",
                                       "--train.micro_batch_size", "1"])
        losses[kind] = SFTLoop(cfg, model, tok, samples).micro_loss(samples, samples)[0]
    s = samples[0]
    ids = torch.cat([s.prompt_ids, s.response_ids])[None]
    logp = logprobs_from_logits(model(input_ids=ids).logits[:, :-1], ids[:, 1:])[0, -len(s.response_ids):]
    torch.testing.assert_close(losses["nll"], -logp.mean(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses["dft"], -(logp.exp() * logp).mean(), rtol=1e-5, atol=1e-6)
    assert float(losses["dft"]) < float(losses["nll"])


def test_margin_loss_subtracts_each_pairs_margin_by_hand(tmp_path):
    model, tok = tiny_model_and_tokenizer(seed=0)
    rows = [{"prompt": "q:", "chosen": "77", "rejected": "1", "margin": 2.0},
            {"prompt": "r:", "chosen": "7", "rejected": "11", "margin": -0.5}]
    pairs, _ = load_pairs(write(tmp_path / "p.jsonl", rows), TextFormat(tok), seed=None)
    model.save_pretrained(tmp_path / "m")
    rm = init_reward_model(tmp_path / "m", tok.pad_token_id, torch.float32, seed=0)
    losses = {}
    for on in (False, True):
        cfg = parse_config(RMConfig, ["--train.batch_size", "2", "--train.micro_batch_size", "1",
                                      "--model.margin_loss_enable", str(on)])
        loop = RMLoop(cfg, rm, tok, pairs)
        losses[on] = sum(loop.micro_loss([p], pairs)[0] for p in pairs)
    with torch.no_grad():
        s = loop.scores([p.chosen for p in pairs] + [p.rejected for p in pairs])
    c, r = s[:2], s[2:]
    torch.testing.assert_close(losses[True], (-F.logsigmoid(c - r - torch.tensor([2.0, -0.5]))).mean())
    torch.testing.assert_close(losses[False], (-F.logsigmoid(c - r)).mean())


def test_center_rewards_adds_the_mean_squared_pair_sum_by_hand(tmp_path):
    """TRL's center_rewards_coefficient: loss = BT + c * mean((r(chosen) + r(rejected))^2), 2 pairs of 1 per
    micro-batch summing to the step's mean; a negative coefficient is refused."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    rows = [{"prompt": "q:", "chosen": "77", "rejected": "1"}, {"prompt": "r:", "chosen": "7", "rejected": "11"}]
    pairs, _ = load_pairs(write(tmp_path / "p.jsonl", rows), TextFormat(tok), seed=None)
    model.save_pretrained(tmp_path / "m")
    rm = init_reward_model(tmp_path / "m", tok.pad_token_id, torch.float32, seed=0)
    cfg = parse_config(RMConfig, ["--train.batch_size", "2", "--train.micro_batch_size", "1",
                                  "--model.center_rewards_coef", "0.5"])
    loop = RMLoop(cfg, rm, tok, pairs)
    loss = sum(loop.micro_loss([p], pairs)[0] for p in pairs)
    with torch.no_grad():
        s = loop.scores([p.chosen for p in pairs] + [p.rejected for p in pairs])
    c, r = s[:2], s[2:]
    torch.testing.assert_close(loss, (-F.logsigmoid(c - r)).mean() + 0.5 * ((c + r) ** 2).mean())
    with pytest.raises(ConfigError, match="--model.center_rewards_coef"):
        RMConfig.from_args(["--model.center_rewards_coef", "-0.1"])


def seq_logps(model, sample):
    ids = torch.cat([sample.prompt_ids, sample.response_ids]).unsqueeze(0)
    logits = model(input_ids=ids).logits[0, len(sample.prompt_ids) - 1 : -1]
    return logprobs_from_logits(logits, sample.response_ids)


@pytest.mark.parametrize("micro", [1, 3])
def test_dpo_plus_nll_adds_the_chosen_token_mean_nll_by_hand(tmp_path, micro):
    """loss = DPO + c * mean over the step's pairs of (-mean over the chosen response's tokens of
    log pi); the same whatever the micro-batch size."""
    model, tok = tiny_model_and_tokenizer(seed=0)
    ref, _ = tiny_model_and_tokenizer(seed=3)
    rows = [{"prompt": f"q{i}:", "chosen": "7" * (1 + i), "rejected": "1" * (3 - i)} for i in range(3)]
    pairs, _ = load_pairs(write(tmp_path / "p.jsonl", rows), TextFormat(tok), seed=None)
    cfg = parse_config(DPOConfig, ["--train.batch_size", "3", "--train.micro_batch_size", str(micro),
                                   "--model.beta", "0.3", "--model.nll_loss_coef", "0.7"])
    loop = DPOLoop(cfg, model, tok, pairs, ref=ref)
    total, nll_metric = 0.0, 0.0
    for i in range(0, 3, micro):
        loss, metrics = loop.micro_loss(pairs[i : i + micro], pairs)
        total, nll_metric = total + loss, nll_metric + metrics["nll_loss"]
    with torch.no_grad():
        lp = {side: [seq_logps(m, getattr(p, side.split("_")[1])) for p in pairs]
              for side, m in [("pi_chosen", model), ("pi_rejected", model), ("ref_chosen", ref),
                              ("ref_rejected", ref)]}
        sums = {k: torch.stack([x.sum() for x in v]) for k, v in lp.items()}
        dpo, _ = dpo_loss(sums["pi_chosen"], sums["pi_rejected"], sums["ref_chosen"], sums["ref_rejected"], beta=0.3)
        nll = torch.stack([-x.mean() for x in lp["pi_chosen"]]).mean()
    torch.testing.assert_close(total.detach(), dpo + 0.7 * nll, rtol=1e-5, atol=1e-6)
    assert nll_metric == pytest.approx(float(nll), rel=1e-5)
    assert float(nll) > 0.1  # the term is not negligible, so its absence would fail the first check


def test_dpo_without_nll_has_no_nll_term(tmp_path):
    model, tok = tiny_model_and_tokenizer(seed=0)
    (pair,), _ = load_pairs(write(tmp_path / "p.jsonl", [{"prompt": "q", "chosen": "7", "rejected": "1"}]),
                            TextFormat(tok))
    cfg = parse_config(DPOConfig, ["--train.batch_size", "1", "--train.micro_batch_size", "1"])
    loss, metrics = DPOLoop(cfg, model, tok, [pair], ref=model).micro_loss([pair], [pair])
    assert "nll_loss" not in metrics
    torch.testing.assert_close(loss.detach(), torch.tensor(0.6931472), rtol=1e-5, atol=1e-6)  # log 2: pi = ref
