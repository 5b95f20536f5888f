"""A script users bring: OpenRLHF's examples/scripts/train_prorlv2_math_hybrid_engine.sh (ProRL v2: the
flags it passes to `openrlhf.cli.train_ppo_ray`, the model, datasets, reward file and save path swapped
for a tiny Llama and local files). `rlhfkit plan` plans it at its own sizes (512 prompts x 16 samples,
8192 new tokens), and `rlhfkit train rl` runs one step of it at sizes a CPU runs in seconds: the
REINFORCE++-baseline estimator, clip-higher, dynamic filtering, the k2 KL loss, ICEPOP's
importance-sampling correction and the stop-properly penalty with coefficient 0."""

import json

from rlhfkit.cli.main import main
from rlhfkit.config import RLConfig
from tests.integration.conftest import SEVENS_REWARD


def prorl_flags(model: str, data: str, reward: str, eval_data: str, out: str) -> list[str]:
    """The script's flags, in its order, with its paths replaced by these."""
    return ["--ref_num_nodes", "1", "--ref_num_gpus_per_node", "8", "--actor_num_nodes", "1",
            "--actor_num_gpus_per_node", "8", "--vllm_num_engines", "8", "--vllm_tensor_parallel_size", "1",
            "--colocate_all_models", "--vllm_gpu_memory_utilization", "0.75", "--init_kl_coef", "1e-4",
            "--gamma", "1.0", "--use_kl_loss", "--kl_estimator", "k2", "--advantage_estimator", "reinforce_baseline",
            "--dynamic_filtering", "--dynamic_filtering_reward_range", "0", "1", "--eps_clip_low_high", "0.2",
            "0.27", "--pretrain", model, "--remote_rm_url", reward, "--save_path", out, "--ckpt_path",
            f"{out}/ckpt", "--save_steps", "5", "--save_hf_ckpt", "--train_batch_size", "1024",
            "--rollout_batch_size", "512", "--n_samples_per_prompt", "16", "--use_dynamic_batch",
            "--num_episodes", "100", "--prompt_max_len", "1024", "--generate_max_len", "8192", "--zero_stage", "3",
            "--param_dtype", "bf16", "--actor_learning_rate", "1e-6", "--prompt_data", data, "--input_key",
            "prompt", "--label_key", "label", "--eval_dataset", eval_data, "--eval_steps", "5",
            "--eval_temperature", "1.0", "--eval_n_samples_per_prompt", "4", "--apply_chat_template",
            "--gradient_checkpointing", "--packing_samples", "--vllm_sync_backend", "nccl", "--enforce_eager",
            "--vllm_enable_sleep", "--deepspeed_enable_sleep", "--enable_vllm_is_correction",
            "--vllm_is_truncated_threshold", "0.5", "5.0", "--use_icepop", "--train_max_tokens_per_gpu", "32768",
            "--stop_properly_penalty_coef", "0.0"]


# the sizes of one CPU step, after the script's flags (a later flag wins)
SMALL = ["--rollout_batch_size", "2", "--n_samples_per_prompt", "4", "--train_batch_size", "8",
         "--micro_train_batch_size", "8", "--generate_max_len", "4", "--prompt_max_len", "64",
         "--train.max_steps", "1", "--eval_n_samples_per_prompt", "1", "--train_max_tokens_per_gpu", "256",
         "--logger.progress_bar", "false", "--train.num_threads", "1"]


def workspace(tiny_ws):
    ws = tiny_ws("prorl")
    rows = [{"prompt": [{"role": "user", "content": f"{i} + {i} = ?"}], "label": str(2 * i)} for i in range(16)]
    (ws / "math.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (ws / "aime.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    (ws / "reward.py").write_text(SEVENS_REWARD)
    return ws


def test_openrlhfs_prorl_v2_script_plans_at_its_sizes_and_runs_a_step(tiny_ws, tmp_path, capsys):
    ws = workspace(tiny_ws)
    out = tmp_path / "run"
    flags = prorl_flags(str(ws / "tiny"), str(ws / "math.jsonl"), str(ws / "reward.py"), str(ws / "aime.jsonl"),
                        str(out))
    cfg = RLConfig.from_args(flags)
    a, k = cfg.algo.advantage, cfg.algo.kl
    assert (a.estimator, a.gamma, a.is_correction_enable, a.is_correction_type, a.is_correction_threshold) == \
        ("reinforce_baseline", 1.0, True, "icepop", (0.5, 5.0))
    assert (k.init_coef, k.use_loss, k.estimator) == (1e-4, True, "k2")
    assert cfg.actor.eps_clip_low_high == (0.2, 0.27) and cfg.algo.dynamic_filtering_enable
    assert cfg.reward.stop_properly_penalty_coef == 0.0 and cfg.actor.dtype == "bfloat16"
    assert (cfg.rollout.batch_size, cfg.rollout.n_samples_per_prompt, cfg.rollout.max_new_tokens) == (512, 16, 8192)

    assert main(["plan", *flags]) == 0  # the script's own sizes: 512 x 16 samples a rollout, 1024 a step
    planned = {line[:30].strip(): line[30:].split()[0] for line in capsys.readouterr().out.splitlines()
               if len(line) > 30 and line[30:].strip()}
    assert planned["samples per rollout"] == "8192"  # 512 prompts x 16
    assert planned["optimizer steps per rollout"] == "8"  # 8192 samples / 1024 a step

    assert main(["train", "rl", *flags, *SMALL]) == 0
    [step] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"reward"' in line]
    assert step["step"] == 1 and "kl_loss" in step and "stop_properly_penalised" in step
    assert (out / "final" / "model.safetensors").is_file()
