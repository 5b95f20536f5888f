"""The typed configuration of `rlhfkit train rl`: one frozen dataclass per component.

Flag names follow OpenRLHF's dotted names where the meaning is the same
(`--actor.model_name_or_path`, `--rollout.n_samples_per_prompt`, `--algo.kl.init_coef`, ...).
`validate()` checks that the settings fit together before any model loads and returns the
derived batch arithmetic of OpenRLHF's PPO loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlhfkit.config.defaults import PROMPT_MAX_LEN
from rlhfkit.config.openrlhf import RL_FLAGS
from rlhfkit.config.parse import Alias, parse_config
from rlhfkit.config.ranges import ORDERED, check_ranges, validate_table
from rlhfkit.errors import ConfigError

# The names the trainer accepts; the math behind each lives in rlhfkit.core.
ENGINES = ("hf", "vllm")
ADVANTAGE_ESTIMATORS = ("gae", "reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo")
GROUP_ESTIMATORS = ("reinforce_baseline", "rloo", "group_norm", "dr_grpo")
KL_ESTIMATORS = ("k1", "k2", "k3", "k3_stable")
LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm")
POLICY_LOSS_TYPES = ("ppo", "gspo")
LR_SCHEDULERS = ("constant", "cosine", "cosine_with_min_lr")
DTYPES = ("float32", "bfloat16")
AUTOCASTS = (*DTYPES, "auto")
WANDB_MODES = ("online", "offline", "disabled")
WHITEN_MODES = ("true", "mean", "false")
IS_CORRECTION_TYPES = ("tis", "icepop", "seq-mask-tis", "seq_mask_tis")  # OpenRLHF's names; underscores too
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class AdamConfig:
    """AdamW optimizer (torch.optim.AdamW)."""

    lr: float = 1e-6
    """Peak learning rate."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's (beta1, beta2): decay rates of the gradient's first and second moments."""
    eps: float = 1e-8
    """AdamW's epsilon, added to the denominator for numerical stability."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW); 0 = none."""


@dataclass(frozen=True)
class ActorConfig:
    """The policy being trained: model, dtypes, optimizer, schedule and policy loss."""

    model_name_or_path: str = "smollm2"
    """HF folder, a .gguf file, or `smollm2` (the packaged SmolLM2-135M-Instruct, converted once)."""
    dtype: str = "float32"
    """Parameter dtype: float32 or bfloat16 (never float16: ~200x slower on CPU). bfloat16 keeps float32
    master weights and gradient sums in the optimizer (trainers.learner), as DeepSpeed's bf16 mode; under
    --fsdp.enable it becomes float32 sharded parameters computing in bf16 (--fsdp.mixed_precision true)."""
    autocast: str | None = "bfloat16"
    """Compute dtype for forward passes (torch.autocast on --actor.device's type); none = the parameter dtype;
    auto = bfloat16 where it is faster than float32 (a ~0.2 s matmul probe on the CPU; CUDA with bf16 support),
    else none (the choice is printed in one line)."""
    device: str = "auto"
    """Where the policy, reference, critic, reward model and the hf engine run: auto (CUDA when available,
    else the CPU), cpu, cuda or cuda:N. Batches are built on the CPU and moved to it per micro-batch."""
    gradient_checkpointing_enable: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (transformers'
    non-reentrant gradient checkpointing): the same gradients, less activation memory, one more forward per update."""
    adam: AdamConfig = field(default_factory=AdamConfig)
    lr_scheduler: str = "cosine_with_min_lr"
    """Learning-rate schedule after warmup: constant, cosine (to 0) or cosine_with_min_lr."""
    lr_warmup_ratio: float = 0.0
    """Fraction of all optimizer steps spent in linear warmup."""
    min_lr_ratio: float = 0.1
    """cosine_with_min_lr decays to lr * min_lr_ratio."""
    max_norm: float = 1.0
    """Gradient-norm clipping (0 disables)."""
    eps_clip_low_high: tuple[float, float] = (0.2, 0.2)
    """PPO clip range [1 - low, 1 + high] (DAPO's clip-higher with high > low)."""
    dual_clip: float | None = None
    """Dual-clip PPO (Ye et al. 2020): with a negative advantage A, the token's loss is at most
    -dual_clip * A; must be > 1 (none = off)."""
    policy_loss_type: str = "ppo"
    """ppo (token-level ratio) or gspo (sequence-level ratio)."""
    loss_agg_mode: str = "token_mean"
    """How per-token losses are averaged into one number (docs/algorithms.md); counts span the whole
    optimizer step."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (loss -= coef * entropy)."""
    ema_beta: float | None = None
    """Keep an EMA of the policy's weights, updated after each optimizer step and saved as an HF folder
    `ema/` beside `final/` at the end (OpenRLHF --enable_ema --ema_beta), e.g. 0.992."""
    freeze_visual_encoder: bool = False
    """A vision-language policy: its vision tower gets no gradients (it stays bit for bit as loaded; the
    projector and the language model train); the reference shares the frozen tower's values."""


@dataclass(frozen=True)
class CriticConfig:
    """The value model of PPO with --algo.advantage.estimator gae."""

    model_name_or_path: str | None = None
    """Backbone of the critic for gae (a reward-model folder: its backbone and score head); defaults to the actor's."""
    adam: AdamConfig = field(default_factory=lambda: AdamConfig(lr=9e-6))
    value_clip: float | None = 0.5
    """PPO's value clipping: the value loss also takes the new value clipped to old +- value_clip
    and keeps the larger loss (none = off)."""
    max_norm: float = 1.0
    """Gradient-norm clipping of the critic (0 disables)."""


@dataclass(frozen=True)
class RefConfig:
    """The frozen reference model of the KL term (loaded only with --algo.kl.init_coef > 0)."""

    model_name_or_path: str | None = None
    """Reference model for the KL term; defaults to the actor's initial weights."""
    offload: bool = False
    """Keep the reference on the CPU between its passes and move it to --actor.device for the
    experience stage only (frees its weights' device memory during generation and the update;
    the same numbers). A no-op when --actor.device is the CPU."""


@dataclass(frozen=True)
class CodeRewardConfig:
    """builtin:code: how model-written code is run against its tests (see docs/code_rewards.md)."""

    partial_credit: bool = False
    """Reward = the fraction of a sample's tests passed (default: 1 when all pass, else 0)."""
    sandbox: str = "bwrap"
    """Where model code runs: bwrap (bubblewrap: namespaces, a read-only view of the interpreter only,
    an unprivileged uid; refuses to start where bwrap cannot), remote (a SandboxFusion-style server at
    --reward.code.remote_url) or none (unconfined, with a warning)."""
    remote_url: str | None = None
    """--reward.code.sandbox remote: the SandboxFusion-style server (http://HOST:PORT; POST /run_code)."""
    timeout: float = 5.0
    """Wall-clock seconds one test's sandboxed process may run before it is killed."""
    cpu_seconds: int = 2
    """CPU seconds one test's sandboxed process may use (RLIMIT_CPU)."""
    memory_mb: int = 512
    """Address space of one test's sandboxed process, in MiB (RLIMIT_AS)."""
    workers: int = 1
    """Samples judged at once. With bwrap as root, worker k's processes run as uid 65534 - k: uids that
    must belong to no one on the machine."""


@dataclass(frozen=True)
class RewardConfig:
    """Where rewards come from: a reward function, reward servers or a reward model; shaping."""

    remote_url: str | None = None
    """A Python file defining reward_func(queries, prompts, labels, **kwargs), builtin:NAME, or
    http(s):// reward server URLs (comma-separated: requests are sharded across them)."""
    model_name_or_path: str | None = None
    """A reward-model folder from `rlhfkit train rm`; reward = (score - mean) / std from its config. A
    process reward model from `rlhfkit train prm` gives per-step token rewards (estimators gae, reinforce)."""
    offload: bool = False
    """Keep the reward model (--reward.model_name_or_path) on the CPU between its passes and move it to
    --actor.device to score (the same rewards). A no-op when --actor.device is the CPU."""
    request_timeout: float = 60.0
    """HTTP reward: seconds to wait for one request."""
    max_retries: int = 3
    """HTTP reward: retries per request (exponential backoff) before the run stops."""
    request_batch_size: int = 64
    """HTTP reward: most queries per request."""
    auth_token: str | None = None
    """HTTP reward: bearer token sent to the server."""
    overlong_buffer_len: int | None = None
    """DAPO overlong reward shaping: penalise the last buffer_len tokens of the budget."""
    overlong_penalty_factor: float = 1.0
    """DAPO overlong shaping: the penalty at the end of the budget (it grows linearly over the buffer)."""
    normalize: bool = False
    """Normalise rewards by running mean and std (updated every rollout)."""
    clip_range: tuple[float, float] | None = None
    """Clip the (group-shaped) scalar reward to [low, high]."""
    timeout: float | None = 300.0
    """Seconds one call of the reward function may take before the run stops; the call then runs in a
    worker thread. none: no limit, called in the main thread (for functions that use signal.alarm)."""
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    """builtin:code settings."""


@dataclass(frozen=True)
class DataConfig:
    """The prompt dataset of training."""

    prompt_dataset: str | None = None
    """Prompts: a .jsonl / .json / .parquet file, a datasets folder (save_to_disk, or a folder of data
    files), or a hub dataset name (org/name; org/name@dir for a data dir). A local path wins over a hub name."""
    prompt_split: str = "train"
    """The split of a prompt dataset that has several (a hub dataset, a DatasetDict folder); files have none."""
    prompt_dataset_config: str | None = None
    """The hub dataset's config (datasets.load_dataset's name), e.g. main for openai/gsm8k."""
    prompt_data_dir: str | None = None
    """The hub dataset's subfolder to read (datasets.load_dataset's data_dir)."""
    input_key: str = "input"
    """The record's prompt: a string, or a message list [{"role", "content"}, ...] (needs apply_chat_template)."""
    label_key: str | None = None
    """Record key of the label (e.g. the reference answer) given to the reward function; none = no
    labels."""
    apply_chat_template: bool = False
    """Render each prompt with the tokenizer's chat template (as one user message, or the record's
    message list)."""
    input_template: str | None = None
    """A format string with one {} around the prompt, e.g. "Question: {} Answer:" (without a chat
    template)."""
    max_samples: int | None = None
    """Use at most this many prompts of the dataset (none: all)."""
    prompt_max_len: int = PROMPT_MAX_LEN
    """Prompts longer than this many tokens are skipped (counted and logged); image tokens count."""
    image_key: str | None = None
    """Record key of a prompt's images (paths, URLs, bytes or a datasets Image feature; one or a list) for a
    vision-language model (docs/vision.md); none = `images`, else `image`, where the record has one."""
    max_images_per_prompt: int = 1
    """Most images one prompt may hold; a record with more is refused before the model loads."""


@dataclass(frozen=True)
class RolloutConfig:
    """Generation: prompts per batch, samples per prompt, sampling settings, engine."""

    batch_size: int = 16
    """Prompts per rollout batch (OpenRLHF rollout_batch_size)."""
    n_samples_per_prompt: int = 8
    """Completions sampled per prompt (the group size of group estimators)."""
    max_new_tokens: int = 64
    """Most tokens generated per completion (OpenRLHF generate_max_len)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the fewest tokens whose probability sums to top_p (1 = off)."""
    top_k: int = -1
    """Sample from the k most likely tokens only (-1 = off)."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a completion besides the tokenizer's EOS (e.g. 13,198)."""
    max_batch_size: int = 128
    """Largest number of sequences decoded together (memory bound)."""
    num_workers: int = 1
    """Rollout worker actors with --distributed.backend ray (each holds a policy copy + an engine)."""
    engine: str = "hf"
    """Generation engine: hf (transformers, CPU or GPU) or vllm (`pip install 'rlhfkit[vllm]'`; see docs/scaling.md)."""
    compile_decode: bool = False
    """hf engine: decode steps under torch.compile over a static KV cache, compiled once per process and
    model (CUDA graphs on CUDA, untested on a GPU so far). Off on the CPU, with one logged line: there the
    compiled step measured 1.05x the eager loop on SmolLM2 after a first compile of 40-90 s
    (docs/performance.md). Falls back to the eager loop with one logged line where it cannot be built."""


@dataclass(frozen=True)
class AdvantageConfig:
    """The advantage estimator (docs/algorithms.md has each formula)."""

    estimator: str = "group_norm"
    """gae (PPO with a critic), reinforce (REINFORCE++), reinforce_baseline, rloo, group_norm
    (GRPO),
    dr_grpo."""
    gamma: float = 1.0
    """Discount factor of returns (forced to 1 for the group estimators)."""
    lambd: float = 0.95
    """GAE's lambda: bias-variance trade-off of the advantage (gae only)."""
    whiten: str = "true"
    """Whitening of gae/reinforce/reinforce_baseline advantages: true, mean, false."""
    is_correction_enable: bool = False
    """Correct the rollout engine / trainer logprob mismatch: weigh each token's loss by
    pi_trainer / pi_engine, truncated (OpenRLHF --enable_vllm_is_correction; docs/algorithms.md)."""
    is_correction_type: str = "tis"
    """How the weight is truncated: tis (clamped to the threshold), icepop (zeroed outside it),
    seq-mask-tis (clamped, and a sequence zeroed when its geometric-mean weight is outside it)."""
    is_correction_threshold: tuple[float, float] = (0.5, 5.0)
    """LOW HIGH bounds of the IS weight (with --algo.advantage.decoupled_enable too: the behaviour
    weight is truncated by is_correction_type when is_correction_enable, else not)."""
    decoupled_enable: bool = False
    """Decoupled PPO (AReaL): clip around the trainer's policy before the update (its logprobs are
    computed), weigh by pi_trainer / pi_engine; always on with --train.async_enable."""


@dataclass(frozen=True)
class KLConfig:
    """The KL penalty against the reference model."""

    init_coef: float = 0.0
    """KL coefficient; 0 = no reference model at all."""
    estimator: str = "k1"
    """KL estimator: k1 (log-ratio), k2 (half its square), k3 (Schulman's exp(r) - 1 - r), k3_stable
    (k3 where r < 0, else k1); formulas in docs/algorithms.md."""
    use_loss: bool = False
    """KL as a loss term (GRPO style) instead of a per-token reward penalty (PPO style)."""
    target: float | None = None
    """With a target, the coefficient adapts (Ziegler et al.) over `horizon` samples."""
    horizon: int = 10000
    """Adaptive KL (with --algo.kl.target): samples over which the coefficient moves toward the
    target."""


@dataclass(frozen=True)
class AlgoConfig:
    """The RL algorithm: advantages, KL, DAPO dynamic sampling."""

    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    kl: KLConfig = field(default_factory=KLConfig)
    dynamic_filtering_enable: bool = False
    """DAPO dynamic sampling: drop groups whose mean score is outside dynamic_filtering_range and
    top the batch up with new prompts."""
    dynamic_filtering_range: tuple[float, float] = (0.0, 1.0)
    """Keep a group when low < mean score < high (exclusive: (0, 1) drops all-0 and all-1 groups)."""
    dynamic_filtering_max_rounds: int = 8
    """Most generation rounds per rollout batch; after them the batch trains as filled so far."""
    teacher_model_name_or_path: str | None = None
    """On-policy distillation: a teacher with the policy's tokenizer scores the policy's samples; its
    per-token reverse KL is a dense reward (teacher_topk 0) or a loss term (teacher_topk k) added to the
    task reward's. None: no teacher."""
    teacher_coef: float = 1.0
    """Weight of the teacher term: per-token reward -teacher_coef * (log p_policy - log p_teacher) of each
    sampled token, or teacher_coef * the top-k reverse KL in the loss."""
    teacher_topk: int = 0
    """0: the reverse KL of the sampled tokens is the per-token reward; k: the reverse KL over the policy's
    k most likely tokens (plus one bucket for the rest) is a loss term, its gradient exact on that support."""
    teacher_kl_estimator: str = "k1"
    """The KL estimator of the logged opd/kl, from the sampled tokens; the reward is always
    log p_teacher - log p_policy (the k1 score-function gradient, as OpenRLHF's train_opd)."""
    teacher_offload: bool = False
    """Keep the teacher on the CPU between its passes, moved to the policy's device for each."""


@dataclass(frozen=True)
class AgentConfig:
    """Multi-turn agents: an environment that acts on the model's actions and gives rewards."""

    func_path: str | None = None
    """An agent file (AgentInstance / AgentExecutor, OpenRLHF's contract) or builtin:calculator,
    builtin:guess; rewards then come from the agent's step()."""
    max_turns: int = 4
    """Most actions per episode."""
    max_response_tokens: int | None = None
    """Most response tokens (actions + feedback) per episode; none = max_new_tokens x max_turns."""
    tools: str | None = None
    """Tools as Python functions, FILE_OR_MODULE:fn1,fn2 (a .py file or an importable module; no
    names: its public functions), or builtin:calculator, builtin:python (runs model-written code
    in the code sandbox). Their schemas go into the chat template's tools=; the model's calls
    run each turn and their results come back as tool turns; rewards from --reward.*."""
    tool_parser: str | None = None
    """How the model writes tool calls: hermes (Qwen2.5/Qwen3/Hermes), llama3_json, mistral;
    none = the tokenizer's response template, else read off its chat template."""
    tool_calls_per_episode: int = 8
    """Most tool calls run per episode (further calls get an error result)."""
    tool_timeout: float = 10.0
    """Seconds a tool call may take before its result is an error."""
    tool_result_tokens: int = 256
    """Most tokens of one tool result (longer results are cut)."""


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
    max_skipped_steps: int = 5
    """Stop after this many optimizer steps in a row skipped for a NaN/inf loss or gradient (0: never)."""
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
    """Write a checkpoint (model, optimizer, RNG, data position, ...) every N RL steps (-1: only the
    final model)."""
    max_num: int = 3
    """Keep the newest N checkpoints in <output_dir>/checkpoints."""
    load_enable: bool = False
    """Resume from the newest intact checkpoint in <output_dir>/checkpoints (start fresh if none)."""


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
class LoggerConfig:
    """Console, TensorBoard, wandb and sample logs."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    tensorboard_dir: str | None = None
    """TensorBoard log dir (default: <output_dir>/tensorboard)."""
    progress_bar: bool = True
    """Per-step console output: a progress bar on a terminal, one plain line per step otherwise
    (nohup, pipes, batch jobs); false = neither."""
    log_samples: int = 4
    """Completions per step written to samples.jsonl."""
    log_level: str = "info"
    """Print the `rlhfkit` logger's messages from this level up (notes: info; problems: warning)."""


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
    """Logical CPUs of a local Ray cluster; none = rollout.num_workers + 1 (one per actor)."""
    num_gpus_per_worker: float | None = None
    """GPUs each rollout worker actor asks Ray for; none = the GPUs present shared by the trainer and the
    workers (one each where there are enough, an equal share of them otherwise; 0 without GPUs)."""
    num_gpus_trainer: float | None = None
    """GPUs the trainer actor asks Ray for; none = as --distributed.num_gpus_per_worker."""


@dataclass(frozen=True)
class VLLMConfig:
    """The vLLM engine (--rollout.engine vllm, GPU)."""

    gpu_memory_utilization: float | None = None
    """Share of GPU memory vLLM may take (weights + KV cache); none = 0.5: vLLM runs in the trainer's
    process on the trainer's GPU, which already holds the policy (more than the free share is refused)."""
    enable_sleep: bool | None = None
    """Colocation: free vLLM's KV cache and weights while the trainer updates; none = on where CUDA is
    present (the update then gets the GPU back), off elsewhere (vLLM's sleep mode needs CUDA)."""
    tensor_parallel_size: int = 1
    """GPUs per vLLM engine."""


@dataclass(frozen=True)
class FSDPConfig:
    """Sharded training with FSDP2 under torchrun."""

    enable: bool = False
    """Shard the policy with FSDP2 (torch fully_shard) across the processes of `torchrun`; see docs/scaling.md."""
    mixed_precision: bool = False
    """FSDP2 bf16 parameters in forward/backward over float32 shards (the master weights), with float32
    gradient reduction (MixedPrecisionPolicy); --actor.dtype bfloat16 under FSDP turns it on."""


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


@dataclass(frozen=True)
class RLDSConfig:
    """LoRA adapters on the policy (OpenRLHF's DeepSpeed section): only the adapters train; the
    reference of the KL term is the base model (the policy with its adapters disabled, no second
    copy of the weights); final/ is peft's adapter folder (`rlhfkit lora merge` folds it in)."""

    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass(frozen=True)
class RLConfig:
    """Every setting of `rlhfkit train rl`, one section per component (`--section.name VALUE`)."""

    actor: ActorConfig = field(default_factory=ActorConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    ckpt: CkptConfig = field(default_factory=CkptConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    ds: RLDSConfig = field(default_factory=RLDSConfig)

    @classmethod
    def from_args(cls, argv: list[str]) -> RLConfig:
        """Parse the CLI's flags (dotted names, OpenRLHF's flat names, --config FILE.yaml) and validate."""
        cfg = parse_config(cls, list(argv), aliases=RL_ALIASES)
        validate(cfg)
        return cfg


# Every flag of OpenRLHF's train_ppo_ray (flat and dotted names: mapped, noticed or refused; see
# config/openrlhf.py), and earlier names of our own flags.
RL_ALIASES: dict[str, str | Alias] = {
    **RL_FLAGS,
    "rollout.dynamic_filtering": "algo.dynamic_filtering_enable",
    "algo.overlong_buffer_len": "reward.overlong_buffer_len",
    "algo.overlong_penalty_factor": "reward.overlong_penalty_factor",
    "distributed.fsdp": "fsdp.enable",
    "device": "actor.device",
}


@dataclass(frozen=True)
class BatchPlan:
    """Derived batch arithmetic (OpenRLHF's PPO loop), filled in by `validate`."""

    samples_per_rollout: int
    micro_batches_per_step: int
    optimizer_steps_per_rollout: int


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _one_of(name: str, value: str, valid: tuple[str, ...]) -> None:
    _require(value in valid, f"--{name}: unknown value {value!r}; valid: {', '.join(valid)}")


ADAM_RANGES = {"lr": "> 0", "betas": "[0, 1)", "eps": "> 0", "weight_decay": ">= 0"}
SEED_RANGE = "[0, 4294967295]"
CODE_SANDBOXES = ("bwrap", "remote", "none")

# The allowed range of every numeric flag of `train rl` (see config/ranges.py); checked first by `validate`.
RL_RANGES = validate_table({
    **{f"actor.adam.{k}": v for k, v in ADAM_RANGES.items()},
    "actor.lr_warmup_ratio": "[0, 1]", "actor.min_lr_ratio": "[0, 1]", "actor.max_norm": ">= 0",
    "actor.eps_clip_low_high": ("[0, 1)", ">= 0"), "actor.dual_clip": "> 1", "actor.entropy_coef": ">= 0",
    "actor.ema_beta": "[0, 1]",
    **{f"critic.adam.{k}": v for k, v in ADAM_RANGES.items()},
    "critic.value_clip": "> 0", "critic.max_norm": ">= 0",
    "reward.request_timeout": "> 0", "reward.max_retries": ">= 0", "reward.request_batch_size": ">= 1",
    "reward.overlong_buffer_len": ">= 1", "reward.overlong_penalty_factor": ">= 0", "reward.clip_range": ORDERED,
    "reward.timeout": "> 0",
    "reward.code.timeout": "> 0", "reward.code.cpu_seconds": ">= 1", "reward.code.memory_mb": ">= 64",
    "reward.code.workers": "[1, 64]",
    "data.max_samples": ">= 1", "data.prompt_max_len": ">= 1", "data.max_images_per_prompt": ">= 1",
    "rollout.batch_size": ">= 1", "rollout.n_samples_per_prompt": ">= 1", "rollout.max_new_tokens": ">= 1",
    "rollout.temperature": ">= 0", "rollout.top_p": "(0, 1]", "rollout.top_k": "-1 or >= 1",
    "rollout.stop_token_ids": ">= 0", "rollout.max_batch_size": ">= 1", "rollout.num_workers": ">= 1",
    "algo.advantage.gamma": "[0, 1]", "algo.advantage.lambd": "[0, 1]",
    "algo.advantage.is_correction_threshold": ORDERED,
    "algo.kl.init_coef": ">= 0", "algo.kl.target": "> 0", "algo.kl.horizon": ">= 1",
    "algo.dynamic_filtering_range": ORDERED, "algo.dynamic_filtering_max_rounds": ">= 1",
    "algo.teacher_coef": ">= 0", "algo.teacher_topk": ">= 0",
    "agent.max_turns": ">= 1", "agent.max_response_tokens": ">= 1", "agent.tool_calls_per_episode": ">= 1",
    "agent.tool_timeout": "> 0", "agent.tool_result_tokens": ">= 1",
    "train.batch_size": ">= 1", "train.micro_batch_size": ">= 1", "train.max_tokens_per_micro_batch": ">= 1",
    "train.max_epochs": ">= 1", "train.num_episodes": ">= 1", "train.max_steps": ">= 1", "train.seed": SEED_RANGE,
    "train.num_threads": ">= 1", "train.max_skipped_steps": ">= 0", "train.max_staleness": ">= 0",
    "train.partial_rollout_tokens": ">= 1",
    "ckpt.save_steps": "-1 or >= 1", "ckpt.max_num": ">= 1",
    "logger.log_samples": ">= 0",
    "eval.steps": "-1 or >= 1", "eval.max_samples": ">= 1", "eval.n_samples": ">= 1", "eval.k": ">= 1",
    "eval.temperature": ">= 0",
    "distributed.num_cpus": ">= 1", "distributed.num_gpus_per_worker": ">= 0", "distributed.num_gpus_trainer": ">= 0",
    "vllm.gpu_memory_utilization": "(0, 1]", "vllm.tensor_parallel_size": ">= 1",
    "ds.lora.rank": ">= 0", "ds.lora.alpha": "> 0", "ds.lora.dropout": "[0, 1)",
})


def validate(cfg: RLConfig) -> BatchPlan:
    """Refuse settings that do not fit together; return the derived batch plan."""
    r, t, a = cfg.rollout, cfg.train, cfg.algo
    check_ranges(cfg, RL_RANGES)
    _one_of("algo.advantage.estimator", a.advantage.estimator, ADVANTAGE_ESTIMATORS)
    _one_of("algo.kl.estimator", a.kl.estimator, KL_ESTIMATORS)
    _one_of("algo.teacher_kl_estimator", a.teacher_kl_estimator, KL_ESTIMATORS)
    _one_of("actor.loss_agg_mode", cfg.actor.loss_agg_mode, LOSS_AGG_MODES)
    _one_of("actor.policy_loss_type", cfg.actor.policy_loss_type, POLICY_LOSS_TYPES)
    _one_of("actor.lr_scheduler", cfg.actor.lr_scheduler, LR_SCHEDULERS)
    _one_of("actor.dtype", cfg.actor.dtype, DTYPES)
    _one_of("algo.advantage.whiten", a.advantage.whiten, WHITEN_MODES)
    _one_of("algo.advantage.is_correction_type", a.advantage.is_correction_type, IS_CORRECTION_TYPES)
    _require(a.advantage.is_correction_threshold[0] >= 0,
             f"--algo.advantage.is_correction_threshold: LOW must be >= 0 (a weight is a ratio of probabilities), "
             f"got {a.advantage.is_correction_threshold[0]}")
    if cfg.actor.autocast is not None:
        _one_of("actor.autocast", cfg.actor.autocast, AUTOCASTS)
    check_device("--actor.device", cfg.actor.device)
    if a.advantage.estimator in GROUP_ESTIMATORS:
        _require(r.n_samples_per_prompt >= 2,
                 f"--algo.advantage.estimator {a.advantage.estimator} compares samples of one prompt: "
                 f"set --rollout.n_samples_per_prompt to 2 or more (got {r.n_samples_per_prompt})")
    if a.dynamic_filtering_enable:
        _require(r.n_samples_per_prompt >= 2,
                 "--algo.dynamic_filtering_enable needs --rollout.n_samples_per_prompt >= 2")
    _require(t.batch_size % t.micro_batch_size == 0,
             f"--train.batch_size ({t.batch_size}) must be a multiple of --train.micro_batch_size "
             f"({t.micro_batch_size}); e.g. --train.micro_batch_size {_divisor_hint(t.batch_size, t.micro_batch_size)}")
    samples = r.batch_size * r.n_samples_per_prompt
    _require(samples % t.batch_size == 0,
             f"one rollout makes {samples} samples (--rollout.batch_size {r.batch_size} x "
             f"--rollout.n_samples_per_prompt {r.n_samples_per_prompt}), which --train.batch_size "
             f"({t.batch_size}) must divide; e.g. --train.batch_size {_divisor_hint(samples, t.batch_size)}")
    w = cfg.reward
    _one_of("reward.code.sandbox", w.code.sandbox, CODE_SANDBOXES)
    _require(w.code.sandbox != "remote" or bool(w.code.remote_url),
             "--reward.code.sandbox remote needs --reward.code.remote_url http://HOST:PORT")
    if w.overlong_buffer_len is not None:
        _require(0 < w.overlong_buffer_len <= r.max_new_tokens,
                 f"--reward.overlong_buffer_len must be in [1, --rollout.max_new_tokens={r.max_new_tokens}]")
    check_input_template(cfg.data.input_template)
    _validate_eval(cfg)
    _validate_distributed(cfg)
    _validate_scale(cfg)
    _validate_lora(cfg)
    _one_of("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)
    _one_of("logger.log_level", cfg.logger.log_level, LOG_LEVELS)
    return BatchPlan(
        samples_per_rollout=samples,
        micro_batches_per_step=t.batch_size // t.micro_batch_size,
        optimizer_steps_per_rollout=samples // t.batch_size * t.max_epochs,
    )


DEVICE_NAMES = "auto, cpu, cuda or cuda:N"


def check_device(flag: str, name: str) -> None:
    """`name` is auto, cpu, cuda or cuda:N (whether CUDA is there is checked where the models load)."""
    _require(re.fullmatch(r"auto|cpu|cuda(:\d+)?", name) is not None,
             f"{flag} {name!r}: not a device; valid: {DEVICE_NAMES}")


def check_input_template(template: str | None, flag: str = "--data.input_template") -> None:
    """A format string with exactly one `{}` for the prompt (and literal braces doubled), or None."""
    if template is None:
        return
    try:
        template.format("")
    except (IndexError, KeyError, ValueError) as exc:
        raise ConfigError(f"{flag} {template!r} is not a format string with one '{{}}' for the prompt "
                          f"({type(exc).__name__}: {exc}); double any literal braces as '{{{{' and '}}}}'") from None
    _require("{}" in template, f"{flag} {template!r} has no '{{}}' where the prompt goes (e.g. 'Question: {{}}')")


def _validate_eval(cfg: RLConfig) -> None:
    e = cfg.eval
    _require(e.n_samples == 1 or e.temperature > 0,
             f"--eval.n_samples {e.n_samples} with --eval.temperature 0 draws identical greedy samples; "
             "set --eval.temperature (e.g. 0.7) or --eval.n_samples 1")
    bad = [k for k in e.k if not 1 <= k <= e.n_samples]
    _require(not bad, f"--eval.k {','.join(map(str, e.k))}: every k must be in [1, --eval.n_samples "
                      f"{e.n_samples}]; raise --eval.n_samples or drop {bad}")


BACKENDS = ("local", "ray")


def _validate_distributed(cfg: RLConfig) -> None:
    d, t, n = cfg.distributed, cfg.train, cfg.rollout.num_workers
    _one_of("distributed.backend", d.backend, BACKENDS)
    _require(d.backend == "ray" or (n == 1 and d.address is None),
             "--rollout.num_workers > 1 and --distributed.address need --distributed.backend ray")
    if t.async_enable:
        _require(d.backend == "ray", "--train.async_enable overlaps generation on Ray rollout workers with "
                                     "training: add --distributed.backend ray (the local backend is synchronous)")
        _require(t.max_staleness >= 1, "--train.async_enable trains on samples one policy version old: "
                                       f"set --train.max_staleness 1 or more (got {t.max_staleness})")
    else:
        _require(not t.partial_rollout_enable, "--train.partial_rollout_enable continues generations across the "
                 "weight updates of async training: add --train.async_enable (and --distributed.backend ray)")
        _require(t.max_staleness == 0, f"--train.max_staleness {t.max_staleness} without --train.async_enable: "
                                       "a synchronous run trains on fresh samples only; add --train.async_enable")


def _validate_scale(cfg: RLConfig) -> None:
    """--rollout.engine, --vllm.*, --fsdp.* (whether vllm imports and torchrun runs is checked at build time)."""
    _one_of("rollout.engine", cfg.rollout.engine, ENGINES)
    _require(cfg.rollout.engine == "hf" or cfg.distributed.backend == "local",
             "--rollout.engine vllm runs in the trainer's process for now; Ray rollout workers hold HF engines "
             "(drop --distributed.backend ray or use --rollout.engine hf)")
    _require(not (cfg.fsdp.enable and cfg.distributed.backend == "ray"),
             "--fsdp.enable runs under torchrun with --distributed.backend local; FSDP training with Ray rollout "
             "workers is not supported yet")


def _validate_lora(cfg: RLConfig) -> None:
    """LoRA in RL runs in one process with the hf engine (which generates with the adapted weights)."""
    if cfg.ds.lora.rank == 0:
        return
    for on, what in ((cfg.fsdp.enable, "--fsdp.enable"), (cfg.rollout.engine == "vllm", "--rollout.engine vllm"),
                     (cfg.distributed.backend == "ray", "--distributed.backend ray"),
                     (cfg.actor.ema_beta is not None, "--actor.ema_beta")):
        _require(not on, f"--ds.lora.rank {cfg.ds.lora.rank} does not combine with {what} yet: drop one of them "
                         "(LoRA in RL runs in one process with --rollout.engine hf)")


def lora_targets(lora: LoraConfig) -> tuple[str, ...] | str:
    """'all-linear' stays a string; 'q_proj,v_proj' becomes a tuple of names."""
    if lora.target_modules.strip() == "all-linear":
        return "all-linear"
    return tuple(m.strip() for m in lora.target_modules.split(",") if m.strip())


def _divisor_hint(total: int, wanted: int) -> int:
    """The divisor of `total` nearest to `wanted` (for error messages)."""
    divisors = [d for d in range(1, total + 1) if total % d == 0]
    return min(divisors, key=lambda d: (abs(d - wanted), d))
