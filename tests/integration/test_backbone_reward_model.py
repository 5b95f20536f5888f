"""`rlhfkit train rm` on an architecture with no `*ForSequenceClassification` class in transformers (Cohere2,
Falcon-H1, Mamba): the reward model is the causal LM's decoder (the backbone a PPO critic takes) with a
`score` head (models/backbone_reward.py). Its folder reloads with the scores training computed, through
`load_reward_model`, `train rl --reward.model_name_or_path`'s reward function, `serve-reward` and a critic
initialised from it."""

import pytest
import torch
import transformers

from rlhfkit.api.builder import load_reward
from rlhfkit.api.supervised import RMConfig, RMTrainer
from rlhfkit.cli.serve_reward import served_reward_model
from rlhfkit.config.rl_sections import RewardConfig
from rlhfkit.config.serve import ServeRewardConfig
from rlhfkit.data.batch import collate
from rlhfkit.models.backbone_reward import BackboneRewardModel, last_token_index
from rlhfkit.models.critic import Critic
from rlhfkit.models.reward import batch_scores, init_reward_model, is_reward_model_folder, load_reward_model
from rlhfkit.models.tiny import tiny_config, tiny_tokenizer
from tests.integration.test_supervised_api import PAIRS, flags


def tiny_config_of(arch: str):
    """A 2-layer config of `arch` over the tiny tokenizer; Cohere2 and Mamba are not in models.tiny."""
    ids = {"vocab_size": len(tiny_tokenizer()), "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
           "hidden_size": 64, "num_hidden_layers": 2}
    if arch == "cohere2":
        return transformers.Cohere2Config(**ids, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                          sliding_window=8)
    if arch == "mamba":
        return transformers.MambaConfig(**ids, state_size=8)
    return tiny_config(arch)


BACKBONES = {"cohere2": "Cohere2Model", "falcon_h1": "FalconH1Model", "mamba": "MambaModel"}


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    import json

    root = tmp_path_factory.mktemp("backbone_rm")
    for arch in BACKBONES:
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(tiny_config_of(arch)).save_pretrained(root / arch)
        tiny_tokenizer().save_pretrained(root / arch)
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PAIRS[:8]))
    return root


@pytest.fixture(scope="module")
def trained(ws):
    done = {}

    def train(arch):
        if arch not in done:
            argv = flags(ws, ws / f"rm_{arch}", data__dataset=ws / "pairs.jsonl", train__batch_size=4,
                         train__micro_batch_size=2, adam__lr="1e-2", model__autocast="none")
            argv[1] = str(ws / arch)  # --model.model_name_or_path
            trainer = RMTrainer.from_config(RMConfig.from_args(argv))
            done[arch] = trainer, trainer.train()
        return done[arch]

    return train


@pytest.mark.parametrize("arch", list(BACKBONES))
def test_a_reward_model_without_a_classifier_class_trains_and_reloads_with_its_training_scores(trained, ws, arch):
    trainer, metrics = trained(arch)
    folder = trainer.run_dir / "final"
    assert is_reward_model_folder(folder)
    rm = load_reward_model(folder)
    assert type(rm) is BackboneRewardModel and type(rm.model).__name__ == BACKBONES[arch]
    assert (rm.config.mean, rm.config.std) == pytest.approx((metrics["reward_mean"], metrics["reward_std"]))
    fresh = init_reward_model(ws / arch, 0, seed=trainer.cfg.train.seed)
    assert not torch.equal(fresh.score.weight, rm.score.weight)  # the head trained
    samples = [s for p in trainer.train_items[:3] for s in (p.chosen, p.rejected)]
    with torch.no_grad():
        trainer.algorithm.model.eval()
        during = trainer.algorithm.scores(samples)
        assert torch.allclose(batch_scores(rm, collate(samples, 0)), during, atol=1e-5)
    queries = [trainer.algorithm.tokenizer.decode(torch.cat([s.prompt_ids, s.response_ids])) for s in samples]
    in_rl = load_reward(RewardConfig(model_name_or_path=str(folder)))
    served = served_reward_model(ServeRewardConfig.from_args(["--reward.model_name_or_path", str(folder),
                                                              "--device", "cpu"]))
    assert torch.allclose(in_rl(queries, queries, [None] * 6).extra_logs["rm_score"], during, atol=1e-5)
    assert torch.allclose(served(queries, queries, [None] * 6).extra_logs["rm_score"], during, atol=1e-5)


def test_a_critic_from_it_takes_its_decoder_and_values_its_scores_at_the_last_token(trained):
    trainer, _ = trained("cohere2")
    critic = Critic.from_reward_model(trainer.run_dir / "final")
    assert type(critic.backbone).__name__ == "Cohere2Model"
    batch = collate([p.chosen for p in trainer.train_items[:2]], 0)
    with torch.no_grad():
        values = critic(batch.input_ids, batch.attention_mask)
        last = values[torch.arange(2), last_token_index(batch.attention_mask)]
        assert torch.allclose(last, batch_scores(load_reward_model(trainer.run_dir / "final"), batch), atol=1e-5)


def test_an_architecture_with_a_classifier_class_keeps_it(ws, tmp_path):
    from rlhfkit.models import tiny_model_and_tokenizer

    model, tok = tiny_model_and_tokenizer(seed=0)
    model.save_pretrained(tmp_path / "llama")
    assert type(init_reward_model(tmp_path / "llama", tok.pad_token_id)).__name__ == "LlamaForSequenceClassification"


def test_train_rl_scores_with_it_and_starts_its_critic_from_it(trained, ws, tmp_path):
    """`train rl --reward.model_name_or_path RM --critic.model_name_or_path RM` with a Falcon-H1 reward model on
    its decoder: the reward is its score normalised by its stored mean / std, and the critic (PPO's value
    model, that decoder with the score head as its value head) trains."""
    import json

    from rlhfkit.cli.main import main
    from rlhfkit.models import tiny_model_and_tokenizer

    trainer, _ = trained("falcon_h1")
    folder = trainer.run_dir / "final"
    policy, tok = tiny_model_and_tokenizer(seed=0)
    policy.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"q{i}:"}) + "\n" for i in range(8)))
    out = tmp_path / "ppo"
    argv = ["train", "rl", "--actor.model_name_or_path", str(tmp_path / "policy"), "--data.prompt_dataset",
            str(tmp_path / "prompts.jsonl"), "--data.input_key", "prompt", "--reward.model_name_or_path", str(folder),
            "--critic.model_name_or_path", str(folder), "--algo.advantage.estimator", "gae",
            "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "2", "--rollout.max_new_tokens", "4",
            "--train.batch_size", "8", "--train.micro_batch_size", "4", "--train.max_steps", "1",
            "--actor.autocast", "none", "--logger.progress_bar", "false", "--train.num_threads", "1",
            "--ckpt.output_dir", str(out)]
    assert main(argv) == 0
    (m,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"reward"' in line]
    rm = load_reward_model(folder)
    assert m["reward"] == pytest.approx((m["reward_extra/rm_score"] - rm.config.mean) / rm.config.std, rel=1e-4,
                                        abs=1e-5)
    assert "value_loss" in m


@pytest.mark.parametrize("arch,kind", [("cohere2", "BackboneRewardModel"), ("llama", "LlamaForSequenceClassification")])
def test_a_lora_checkpoint_of_it_exports_and_merges_to_its_folder(ws, tmp_path, arch, kind):
    """A LoRA run's checkpoint (its state dict and adapter card) exports to the folder `train rm` writes, with the
    trained scores; so does its adapter saved on its own through `rlhfkit lora merge` (a sequence classifier's
    too: not a causal LM without the trained head)."""
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    from rlhfkit.api.export import export_checkpoint
    from rlhfkit.cli.main import main

    argv = flags(ws, tmp_path / "rm", data__dataset=ws / "pairs.jsonl", train__batch_size=4,
                 train__micro_batch_size=2, adam__lr="1e-2", model__autocast="none", ds__lora__rank=4,
                 ckpt__save_steps=2)
    base = ws / arch
    if not base.is_dir():
        transformers.AutoModelForCausalLM.from_config(tiny_config_of(arch)).save_pretrained(tmp_path / arch)
        tiny_tokenizer().save_pretrained(tmp_path / arch)
        base = tmp_path / arch
    argv[1] = str(base)
    trainer = RMTrainer.from_config(RMConfig.from_args(argv))
    trainer.train()
    samples = [s for p in trainer.train_items[:3] for s in (p.chosen, p.rejected)]
    final = load_reward_model(trainer.run_dir / "final")
    (ckpt,) = (tmp_path / "rm" / "checkpoints").glob("step_*")
    exported = load_reward_model(export_checkpoint(ckpt, tmp_path / "exported"))
    adapter = get_peft_model(init_reward_model(base, 0), LoraConfig.from_pretrained(ckpt / "model.adapter"))
    adapter.load_state_dict(load_file(ckpt / "model.safetensors"))  # the checkpoint's adapters, saved by peft
    adapter.save_pretrained(tmp_path / "adapter")
    assert main(["lora", "merge", "--lora.adapter", str(tmp_path / "adapter"), "--ckpt.output_dir",
                 str(tmp_path / "merged")]) == 0
    merged = load_reward_model(tmp_path / "merged")
    fresh = init_reward_model(base, 0, seed=trainer.cfg.train.seed)
    with torch.no_grad():
        want = batch_scores(final, collate(samples, 0))
        assert not torch.allclose(batch_scores(fresh, collate(samples, 0)), want, atol=1e-3)  # it trained
        for rm in (exported, merged):
            assert type(rm).__name__ == kind
            assert torch.allclose(batch_scores(rm, collate(samples, 0)), want, atol=1e-5)


def test_a_full_weight_checkpoint_of_it_exports_to_its_folder(ws, tmp_path):
    """Without LoRA a checkpoint holds the reward model's state dict (it has no HF folder of its own): `rlhfkit
    export` writes it over the run's model as `train rm` writes it, with the trained scores."""
    from rlhfkit.cli.main import main

    argv = flags(ws, tmp_path / "rm", data__dataset=ws / "pairs.jsonl", train__batch_size=4,
                 train__micro_batch_size=2, adam__lr="1e-2", model__autocast="none", ckpt__save_steps=2)
    argv[1] = str(ws / "falcon_h1")
    trainer = RMTrainer.from_config(RMConfig.from_args(argv))
    trainer.train()
    assert main(["export", str(tmp_path / "rm"), str(tmp_path / "exported")]) == 0
    exported, final = load_reward_model(tmp_path / "exported"), load_reward_model(trainer.run_dir / "final")
    assert type(exported) is BackboneRewardModel and torch.equal(exported.score.weight, final.score.weight)
    batch = collate([s for p in trainer.train_items[:3] for s in (p.chosen, p.rejected)], 0)
    with torch.no_grad():
        assert torch.allclose(batch_scores(exported, batch), batch_scores(final, batch), atol=1e-6)
