"""The sections of `rlhfkit train rl`'s config that say how a run runs: batch sizes and steps,
checkpoints, logging, evaluation, Ray, vLLM, FSDP2 and LoRA."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.config.rl_sections import LossScaleConfig


@dataclass(frozen=True)
class TrainConfig:
    """The update: batch sizes, epochs, steps, threads, async training."""

    batch_size: int = 128
    """Samples per optimizer step (OpenRLHF train_batch_size)."""
    micro_batch_size: int = 8
    """Samples per forward/backward (gradient accumulation fills batch_size)."""
    dynamic_batch_enable: bool = False
    """Cut micro-batches by --train.max_tokens_per_micro_batch real tokens instead of
    --train.micro_batch_size samples (OpenRLHF --use_dynamic_batch)."""
    max_tokens_per_micro_batch: int = 4096
    """Token budget of one forward/backward with --train.dynamic_batch_enable (a longer sample
    gets a micro-batch of its own)."""
    shared_prefix_enable: bool = True
    """Compute each prompt once for the samples of its group that share a micro-batch (exact:
    same logprobs and gradients as one copy per sample; fewer tokens)."""
    compile_enable: bool = False
    """Run the policy's decoder layers under torch.compile(dynamic=True) in the update's forward and
    backward (rollout and old/reference passes stay eager). Needs a C++ compiler; the first update
    pays the compile (~30 s for SmolLM2 on 2 cores, cached on disk after). verl: use_torch_compile."""
    max_epochs: int = 1
    """Passes over each rollout batch."""
    num_episodes: int = 1
    """Passes over the prompt dataset."""
    max_steps: int | None = None
    """Stop after this many RL steps (rollout batches)."""
    seed: int = 42
    """Seed of the run's random draws (data order, sampling, new weights such as a critic head); on
    CPU the same seed and --train.num_threads give the same run."""
    num_threads: int | None = None
    """torch intra-op threads; none = all cores."""
    keep_freed_memory: bool = True
    """Keep the memory torch frees for the next steps' tensors instead of handing it back to the OS
    (glibc's malloc: large blocks from the heap, no trimming), so the tensors made every step (weight
    casts, gradients, the rollout's bf16 weight copy) reuse mapped pages instead of faulting in new
    ones; the process then holds its peak memory until it exits. Linux (glibc) only."""
    max_skipped_steps: int = 5
    """Stop after this many optimizer steps in a row skipped for a NaN/inf loss or gradient (0: never)."""
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    async_enable: bool = False
    """Generate the next rollout batch (with the weights of the time; agents' episodes too) while
    training on the current one (needs --distributed.backend ray and --train.max_staleness >= 1); the
    loss is then decoupled PPO (--algo.advantage.decoupled_enable)."""
    max_staleness: int = 0
    """Most policy versions a trained sample's oldest token may lag the trainer; staler groups are
    dropped (counted) and their prompts re-issued. 0 = synchronous."""
    partial_rollout_enable: bool = False
    """With --train.async_enable: a generation in flight at a weight update is not restarted; the
    worker loads the new weights between slices of --train.partial_rollout_tokens tokens and
    continues from the tokens and KV cache it has, each token stamped with its policy version
    (the IS / decoupled weights use each token's rollout logprob). OpenRLHF: --partial_rollout."""
    partial_rollout_tokens: int = 8
    """Tokens a rollout worker decodes between two checks for new weights
    (--train.partial_rollout_enable)."""


@dataclass(frozen=True)
class CkptConfig:
    """The run folder and checkpoints."""

    output_dir: str = "runs/rl"
    """Run folder: metrics, TensorBoard events, samples, plots and the final HF model."""
    save_steps: int = -1
    """Write a checkpoint (model, optimizer and schedule, RNG, data order and position) every N steps
    (RL steps; optimizer steps in the supervised commands; -1: only the final model)."""
    max_num: int = 3
    """Keep the newest N checkpoints in <output_dir>/checkpoints."""
    load_enable: bool = False
    """Resume from the newest intact checkpoint in <output_dir>/checkpoints (start fresh if none)."""
    keep_best: str | None = None
    """METRIC[:max|min]: also keep the checkpoint of the evaluation with the best METRIC so far (e.g.
    eval/accuracy, or eval/loss:min; max by default) in <output_dir>/checkpoints/best, besides the
    newest --ckpt.max_num; judged at every evaluation (the periodic ones and the final one), kept
    across resumes; `rlhfkit export` turns it into a model folder."""


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases logging (needs `pip install 'rlhfkit[wandb]'`)."""

    project: str | None = None
    """Log to Weights & Biases under this project (none: no wandb)."""
    name: str | None = None
    """Run name (default: the run folder's name)."""
    mode: str = "online"
    """online, offline (writes to <output_dir>/wandb, no network; sync later) or disabled."""
    group: str | None = None
    """wandb run group (none: no group)."""


@dataclass(frozen=True)
class BaseLoggerConfig:
    """Console, TensorBoard and wandb logs."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    tensorboard_dir: str | None = None
    """TensorBoard log dir (default: <output_dir>/tensorboard)."""
    progress_bar: bool = True
    """Per-step console output: a progress bar on a terminal, one plain line per step otherwise
    (nohup, pipes, batch jobs); false = neither."""
    log_level: str = "info"
    """Print the `rlhfkit` logger's messages from this level up (notes: info; problems: warning)."""


@dataclass(frozen=True)
class LoggerConfig(BaseLoggerConfig):
    """Console, TensorBoard, wandb and sample logs."""

    log_samples: int = 4
    """Completions per step written to samples.jsonl."""


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation on held-out prompts during training (and by `rlhfkit eval`)."""

    dataset: str | None = None
    """Eval prompts, read like --data.prompt_dataset (a file, a datasets folder or a hub dataset name)."""
    split: str = "train"
    """The split of an eval dataset that has several (e.g. test of a hub dataset); files have none."""
    dataset_config: str | None = None
    """The hub eval dataset's config (datasets.load_dataset's name)."""
    data_dir: str | None = None
    """The hub eval dataset's subfolder to read (datasets.load_dataset's data_dir)."""
    steps: int = -1
    """Evaluate every N RL steps (-1: only before and after training)."""
    max_samples: int | None = None
    """Evaluate at most this many prompts (none: all)."""
    n_samples: int = 1
    """Samples per eval prompt; pass@k and maj@k need n_samples >= k."""
    k: tuple[int, ...] = (1,)
    """The k of pass@k and maj@k (e.g. --eval.k 1,4,8); each <= n_samples."""
    temperature: float = 0.0
    """Sampling temperature of evaluation (0 = greedy; needs > 0 when n_samples > 1)."""
    top_p: float = 1.0
    """Nucleus sampling of evaluation: sample among the most likely tokens that reach this probability
    (1 = off; read when --eval.temperature > 0). Training's rollouts use --rollout.top_p."""
    top_k: int = -1
    """Sample among the k most likely tokens in evaluation (-1 = off; read when --eval.temperature > 0)."""
    verifier: str | None = None
    """Task verifier kept apart from the training reward: a reward file or builtin:math
    (none: the training reward's score)."""


@dataclass(frozen=True)
class DistributedConfig:
    """Where the run executes: one process, or Ray rollout workers and a trainer actor."""

    backend: str = "local"
    """local (one process: the engine shares the policy) or ray (rollout worker actors + a trainer actor)."""
    address: str | None = None
    """Ray cluster to join (e.g. HEAD_IP:6379 from `ray start --head`); none = start a local one."""
    num_cpus: int | None = None
    """Logical CPUs of a local Ray cluster, at least one per actor; none = rollout.num_workers + the trainer
    actors (one per actor)."""
    num_gpus_per_worker: float | None = None
    """GPUs each rollout worker actor asks Ray for; none = the GPUs present shared by the trainer and the
    workers (one each where there are enough, an equal share of them otherwise; 0 without GPUs)."""
    num_gpus_trainer: float | None = None
    """GPUs the trainer actor asks Ray for; none = as --distributed.num_gpus_per_worker."""


@dataclass(frozen=True)
class VLLMConfig:
    """The vLLM engine (--rollout.engine vllm, GPU)."""

    gpu_memory_utilization: float | None = None
    """Share of GPU memory vLLM may take (weights + KV cache); none = 0.5 in the trainer's process (on the
    trainer's GPU, which already holds the policy; more than the free share is refused), 0.9 in a Ray
    rollout worker with whole GPUs of its own (0.5 on a shared one)."""
    enable_sleep: bool | None = None
    """Colocation: free vLLM's KV cache and weights while the trainer updates; none = on where CUDA is
    present (the update then gets the GPU back), off elsewhere (vLLM's sleep mode needs CUDA) and in Ray
    rollout workers."""
    tensor_parallel_size: int = 1
    """GPUs per vLLM engine (a Ray rollout worker holding one asks Ray for that many)."""


@dataclass(frozen=True)
class FSDPConfig:
    """Sharded training with FSDP2 under torchrun, or in Ray trainer actors."""

    enable: bool = False
    """Shard the policy with FSDP2 (torch fully_shard) across the processes of `torchrun`, or with
    --distributed.backend ray across --fsdp.num_ranks trainer actors; see docs/scaling.md."""
    num_ranks: int = 1
    """With --distributed.backend ray: the trainer actors (one per GPU) that shard the policy and split each
    optimizer step (OpenRLHF's --actor_num_nodes x --actor_num_gpus_per_node); under torchrun its
    --nproc_per_node sets them instead."""
    mixed_precision: bool = False
    """FSDP2 16-bit parameters in forward/backward over float32 shards (the master weights), with float32
    gradient reduction (MixedPrecisionPolicy): fp16 under --actor.autocast float16 (with the loss scale,
    --train.loss_scale.*), else bf16; --actor.dtype bfloat16 or float16 under FSDP turns it on."""


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters (peft) instead of full fine-tuning."""

    rank: int = 0
    """LoRA rank; 0 = full fine-tuning."""
    alpha: int = 16
    """LoRA scaling: the update is scaled by alpha / rank."""
    target_modules: str = "all-linear"
    """Comma-separated module names (q_proj,v_proj) or all-linear."""
    dropout: float = 0.0
    """Dropout on the LoRA branch's input."""


def lora_targets(lora: LoraConfig) -> tuple[str, ...] | str:
    """'all-linear' stays a string; 'q_proj,v_proj' becomes a tuple of names."""
    if lora.target_modules.strip() == "all-linear":
        return "all-linear"
    return tuple(m.strip() for m in lora.target_modules.split(",") if m.strip())


@dataclass(frozen=True)
class RLDSConfig:
    """LoRA adapters on the policy (OpenRLHF's DeepSpeed section): only the adapters train; the
    reference of the KL term is the base model (the policy with its adapters disabled, no second
    copy of the weights); with --rollout.engine vllm each weight sync sends the adapters merged into
    their layers (the first in full, later ones the adapted modules); final/ is peft's adapter folder
    (`rlhfkit lora merge` folds it in)."""

    lora: LoraConfig = field(default_factory=LoraConfig)
    load_in_4bit: bool = False
    """QLoRA (Dettmers et al. 2023, arXiv:2305.14314): the base model's linear layers load as 4-bit NF4
    weights (bitsandbytes, double quantization, computing in the model's dtype; `pip install
    'rlhfkit[qlora]'`), with --ds.lora.rank > 0: only the adapters train. The LM head and the
    embeddings stay in the model's dtype."""
