"""Real SFT / RM / DPO / KTO / LoRA runs on a tiny Llama, through the CLI, in seconds each."""

import json

import pytest
import torch

from rlhfkit.cli.main import main
from rlhfkit.config.parse import parse_config
from rlhfkit.config.preference import DPOConfig
from rlhfkit.config.sft import SUPERVISED_ALIASES, SFTConfig
from rlhfkit.core.losses import dpo_loss, logprobs_from_logits
from rlhfkit.data.supervised import TextFormat, load_pairs, load_sft
from rlhfkit.models import tiny_model_and_tokenizer
from rlhfkit.trainers.supervised.preference import DPOLoop
from rlhfkit.trainers.supervised.sft import SFTLoop

FACTS = [("a", "cat"), ("b", "dog"), ("c", "owl"), ("d", "fox")]


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def ws(tiny_ws):
    root = tiny_ws("sup")
    write(root / "sft.jsonl", [{"input": f"{k}=", "output": v} for k, v in FACTS])
    # separable preferences: chosen answers are digits 7, rejected ones digits 1
    pairs = [{"prompt": f"q{i}:", "chosen": "7" * (1 + i % 3), "rejected": "1" * (1 + i % 3)} for i in range(48)]
    write(root / "pairs.jsonl", pairs)
    kto = [{"prompt": f"q{i}:", "output": ("7" if i % 2 else "1") * 2, "label": bool(i % 2)} for i in range(32)]
    write(root / "kto.jsonl", kto)
    return root


def flags(**kv):
    argv = []
    for k, v in kv.items():
        argv += [f"--{k.replace('__', '.')}", str(v)]
    return argv + ["--logger.progress_bar", "false", "--train.num_threads", "1"]


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def greedy(model, tok, prompt, n=4):
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    out = model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)


def test_sft_memorises_answers_and_packed_run_matches_padded(ws, tmp_path):
    from transformers import AutoModelForCausalLM

    losses = {}
    for packing, epochs in (("false", 5), ("true", 30)):
        out = tmp_path / packing
        argv = ["train", "sft", *flags(model__model_name_or_path=ws / "tiny", data__dataset=ws / "sft.jsonl",
                                       train__batch_size=4, train__micro_batch_size=2, train__max_epochs=epochs,
                                       adam__lr=1e-2, train__lr_scheduler="constant", train__lr_warmup_ratio=0,
                                       ds__packing_samples=packing, data__eval_dataset=ws / "sft.jsonl",
                                       ckpt__output_dir=out)]
        assert main(argv) == 0
        losses[packing] = [m["loss"] for m in metrics(out) if "loss" in m]
    pad, packed = losses["false"], losses["true"]
    assert packed[-1] < 0.1 * packed[0]
    torch.testing.assert_close(torch.tensor(packed[:5]), torch.tensor(pad), rtol=1e-4, atol=1e-5)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "true" / "final")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "true" / "final")
    for k, v in FACTS:
        assert greedy(model, tok, f"{k}=") == v
    summary = json.loads((tmp_path / "true" / "summary.json").read_text())
    assert summary["eval/loss"] < 0.1


def test_packed_loss_and_gradients_equal_padded(ws):
    model, tok = tiny_model_and_tokenizer(seed=1)
    rows = [{"input": "x" * (1 + i), "output": "abc"[: 1 + i % 3]} for i in range(5)]
    path = write(ws / "eq.jsonl", rows)
    samples, _ = load_sft(path, TextFormat(tok))
    grads = {}
    for packing in (False, True):
        cfg = parse_config(SFTConfig, ["--data.dataset", str(path), "--ds.packing_samples", str(packing),
                                       "--train.batch_size", "5", "--train.micro_batch_size", "5"])
        trainer = SFTLoop(cfg, model, tok, samples)
        model.zero_grad()
        loss, _ = trainer.micro_loss(samples, samples)
        loss.backward()
        grads[packing] = (float(loss.detach()), {k: p.grad.clone() for k, p in model.named_parameters()})
    assert grads[True][0] == pytest.approx(grads[False][0], rel=1e-5)
    for k, g in grads[False][1].items():
        torch.testing.assert_close(grads[True][1][k], g, rtol=1e-4, atol=1e-6, msg=k)


@pytest.fixture(scope="module")
def rm_run(ws):
    out = ws / "rm"
    n = torch.get_num_threads()
    argv = ["train", "rm", *flags(model__model_name_or_path=ws / "tiny", data__dataset=ws / "pairs.jsonl",
                                  data__eval_split=0.25, train__batch_size=12, train__micro_batch_size=6,
                                  train__max_epochs=4, adam__lr=3e-3, ckpt__output_dir=out)]
    assert main(argv) == 0
    torch.set_num_threads(n)
    return out


def test_reward_model_separates_pairs_and_reloads_with_auto_class(rm_run):
    from transformers import AutoModelForSequenceClassification

    out = rm_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["eval/accuracy"] > 0.9
    rm = AutoModelForSequenceClassification.from_pretrained(out / "final").eval()
    assert rm.config.std == pytest.approx(summary["reward_std"])
    assert rm.config.mean == pytest.approx(summary["reward_mean"])
    from rlhfkit.rewards.reward_model import RewardModelFn

    fn = RewardModelFn(out / "final")
    r = fn(["q1:77<eos>", "q1:11<eos>"], ["q1:", "q1:"], [None, None])
    assert r.rewards[0] > r.rewards[1]
    torch.testing.assert_close(r.rewards, (r.extra_logs["rm_score"] - rm.config.mean) / rm.config.std)
    # the same scores the trainer's forward gives: HF reads the last non-pad token
    ids = torch.tensor([[5, 6, 7, 0, 0], [5, 6, 7, 8, 9]])
    full = rm(input_ids=ids).logits.squeeze(-1)
    cut = rm(input_ids=ids[:1, :3]).logits.squeeze(-1)
    torch.testing.assert_close(full[0], cut[0])


def test_packed_reward_model_run_matches_the_padded_one(ws, tmp_path):
    """`train rm --ds.packing_samples`: step by step the same loss, accuracy and scores as the padded run, and the
    same stored mean / std of the final scores (fp32 tolerance)."""
    runs = {}
    for packing in ("false", "true"):
        out = tmp_path / packing
        argv = ["train", "rm", *flags(model__model_name_or_path=ws / "tiny", data__dataset=ws / "pairs.jsonl",
                                      data__eval_split=0.25, train__batch_size=12, train__micro_batch_size=6,
                                      train__max_epochs=1, adam__lr=3e-3, ds__packing_samples=packing,
                                      ckpt__output_dir=out)]
        assert main(argv) == 0
        runs[packing] = [m for m in metrics(out) if "loss" in m], json.loads((out / "summary.json").read_text())
    (padded, pad_summary), (packed, packed_summary) = runs["false"], runs["true"]
    assert len(padded) == len(packed) == 3
    for key in ("loss", "accuracy", "chosen_reward", "rejected_reward"):
        torch.testing.assert_close(torch.tensor([m[key] for m in packed]), torch.tensor([m[key] for m in padded]),
                                   rtol=1e-4, atol=1e-5, msg=key)
    for key in ("reward_mean", "reward_std", "eval/accuracy"):
        assert packed_summary[key] == pytest.approx(pad_summary[key], rel=1e-4, abs=1e-5), key


def test_dpo_raises_margin_and_matches_core_loss(ws, tmp_path):
    out = tmp_path / "dpo"
    argv = ["train", "dpo", *flags(model__model_name_or_path=ws / "tiny", data__dataset=ws / "pairs.jsonl",
                                   train__batch_size=8, train__micro_batch_size=4, train__max_epochs=2,
                                   adam__lr=3e-3, model__beta=0.1, ckpt__output_dir=out)]
    assert main(argv) == 0
    ms = [m for m in metrics(out) if "margin" in m]
    assert ms[0]["margin"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at step 1
    assert sum(m["margin"] for m in ms[-3:]) / 3 > 0.2
    assert sum(m["accuracy"] for m in ms[-3:]) / 3 > 0.9

    # the trainer's loss equals core.dpo_loss on logprobs computed by a plain full forward
    model, tok = tiny_model_and_tokenizer(seed=0)
    ref, _ = tiny_model_and_tokenizer(seed=3)
    pairs, _ = load_pairs(ws / "pairs.jsonl", TextFormat(tok), max_samples=4)
    cfg = parse_config(DPOConfig, ["--data.dataset", "x", "--train.batch_size", "4", "--train.micro_batch_size", "4",
                                   "--model.beta", "0.3", "--model.label_smoothing", "0.1"], SUPERVISED_ALIASES)
    loss, _ = DPOLoop(cfg, model, tok, pairs, ref=ref).micro_loss(pairs, pairs)

    def seq_logp(m, s):
        ids = torch.cat([s.prompt_ids, s.response_ids]).unsqueeze(0)
        logits = m(input_ids=ids).logits[0, len(s.prompt_ids) - 1 : -1]
        return logprobs_from_logits(logits, s.response_ids).sum()

    lp = {n: torch.stack([seq_logp(m, getattr(p, side)) for p in pairs])
          for n, m, side in [("pc", model, "chosen"), ("pr", model, "rejected"), ("rc", ref, "chosen"),
                             ("rr", ref, "rejected")]}
    expected, _ = dpo_loss(lp["pc"], lp["pr"], lp["rc"], lp["rr"], beta=0.3, label_smoothing=0.1)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)


def test_kto_rewards_desirable_over_undesirable(ws, tmp_path):
    out = tmp_path / "kto"
    argv = ["train", "kto", *flags(model__model_name_or_path=ws / "tiny", data__dataset=ws / "kto.jsonl",
                                   train__batch_size=8, train__micro_batch_size=8, train__max_epochs=3,
                                   adam__lr=3e-3, ckpt__output_dir=out)]
    assert main(argv) == 0
    last = metrics(out)[-1]
    assert last["chosen_reward"] > 0 > last["rejected_reward"]


def test_lora_trains_only_adapters_and_merged_folder_reproduces_outputs(ws, tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lora"
    argv = ["train", "sft", *flags(model__model_name_or_path=ws / "tiny", data__dataset=ws / "sft.jsonl",
                                   train__batch_size=4, train__micro_batch_size=4, train__max_epochs=10,
                                   adam__lr=1e-2, ds__lora__rank=4, ds__lora__alpha=8,
                                   ds__lora__target_modules="q_proj,v_proj", ckpt__output_dir=out)]
    from rlhfkit.api.supervised import build_model

    model, _, _ = build_model("sft", SFTConfig.from_args(argv[2:]))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert main(argv) == 0
    adapter = load_file(str(out / "final" / "adapter_model.safetensors"))
    assert adapter and all("lora_" in k for k in adapter)
    assert any("q_proj" in k for k in adapter) and not any("k_proj" in k for k in adapter)
    base = AutoModelForCausalLM.from_pretrained(ws / "tiny")
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(ws / "tiny"), out / "final").eval()
    assert main(["lora", "merge", "--lora.adapter", str(out / "final"), "--ckpt.output_dir", str(tmp_path / "m")]) == 0
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "m").eval()
    ids = torch.tensor([[5, 17, 30, 41, 8]])
    with torch.no_grad():
        a, m, b = adapted(input_ids=ids).logits, merged(input_ids=ids).logits, base(input_ids=ids).logits
    torch.testing.assert_close(m, a, rtol=1e-4, atol=1e-4)
    assert (a - b).abs().max() > 1e-2  # the adapter changed the model


def test_cli_rejects_bad_flags_in_one_line(ws, capsys):
    assert main(["train", "dpo", "--data.dataset", str(ws / "pairs.jsonl"), "--model.ipo_enable",
                 "--model.label_smoothing", "0.1"]) == 2
    assert "exclusive" in capsys.readouterr().err
    assert main(["train", "sft", "--data.datset", "x"]) == 2
    assert "did you mean --data.dataset" in capsys.readouterr().err
    # OpenRLHF's flat names are aliases
    cfg = parse_config(SFTConfig, ["--pretrain", "p", "--dataset", "d", "--lora_rank", "8", "--packing_samples"],
                       SUPERVISED_ALIASES)
    assert (cfg.model.model_name_or_path, cfg.data.dataset, cfg.ds.lora.rank,
            cfg.ds.packing_samples) == ("p", "d", 8, True)


def test_rl_with_trained_reward_model_and_critic_from_it(ws, rm_run, tmp_path):
    from rlhfkit.models import Critic
    from rlhfkit.models.reward import load_reward_model

    # the critic starts as the reward model: its value at the last token is the RM score
    rm = load_reward_model(rm_run / "final").eval()
    critic = Critic.from_reward_model(rm_run / "final").eval()
    ids = torch.tensor([[5, 17, 30, 41, 8]])
    with torch.no_grad():
        torch.testing.assert_close(critic(ids, torch.ones_like(ids))[0, -1], rm(input_ids=ids).logits[0, 0])
    write(ws / "prompts.jsonl", [{"prompt": f"q{i}:"} for i in range(16)])
    out = tmp_path / "ppo"
    argv = ["train", "rl", "--actor.model_name_or_path", str(ws / "tiny"), "--data.prompt_dataset",
            str(ws / "prompts.jsonl"), "--data.input_key", "prompt",
            "--reward.model_name_or_path", str(rm_run / "final"), "--critic.model_name_or_path", str(rm_run / "final"),
            "--algo.advantage.estimator", "gae", "--rollout.batch_size", "8", "--rollout.n_samples_per_prompt", "2",
            "--rollout.max_new_tokens", "4", "--train.batch_size", "16", "--train.micro_batch_size", "8",
            "--train.max_steps", "2", "--actor.adam.lr", "1e-3", "--actor.autocast", "none",
            "--logger.progress_bar", "false", "--train.num_threads", "1", "--ckpt.output_dir", str(out)]
    assert main(argv) == 0
    ms = metrics(out)
    assert len(ms) == 2 and all("reward_extra/rm_score" in m and "value_loss" in m for m in ms)
    # the reward is the RM score normalised by the mean/std stored in the RM's config
    m0 = ms[0]
    expected = (m0["reward_extra/rm_score"] - rm.config.mean) / rm.config.std
    assert m0["reward"] == pytest.approx(expected, rel=1e-4, abs=1e-5)
