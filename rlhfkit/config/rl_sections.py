"""The sections of `rlhfkit train rl`'s config that say what is trained and how: the actor, critic and
reference models and their optimizer, the reward, the prompts, the rollout, the algorithm (advantage,
KL, filtering, distillation) and the agent. The names each choice accepts are in config/rl_checks.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlhfkit.config.defaults import PROMPT_MAX_LEN


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
class MuonConfig:
    """Muon (torch.optim.Muon) for the hidden weight matrices, with the optimizer choice muon: every 2-D
    parameter whose name contains neither embed nor lm_head; the embeddings, LM head, norms and biases
    stay with AdamW (the adam section's settings), as OpenRLHF splits them. The weight decay is adam's."""

    lr: float = 0.02
    """Peak learning rate of the Muon matrices (the schedule scales it as it scales adam's)."""
    momentum: float = 0.95
    """Momentum of the gradient (its buffer: momentum x buffer + (1 - momentum) x gradient)."""
    ns_steps: int = 5
    """Newton-Schulz iterations that orthogonalise each matrix's update."""
    nesterov: bool = True
    """Nesterov momentum: orthogonalise gradient + momentum x (buffer - gradient) instead of the buffer."""


@dataclass(frozen=True)
class LossScaleConfig:
    """Dynamic loss scaling of a float16 forward (float16 parameters or float16 autocast), as DeepSpeed's
    fp16 mode with its defaults: the loss is multiplied by the scale before backward and the gradients
    divided by it before clipping; an overflowing step (inf / NaN gradient) is skipped and the scale
    lowered, a window of steps without one raises it (logged as loss_scale). Ignored outside float16."""

    enable: bool = True
    """Scale float16 losses (false: unscaled float16 gradients; small ones round to zero)."""
    initial_scale_power: int = 16
    """The first scale is 2^N (DeepSpeed's initial_scale_power)."""
    window: int = 1000
    """Steps in a row without an overflow before the scale doubles (DeepSpeed's loss_scale_window)."""
    hysteresis: int = 2
    """Overflows taken before the scale halves; refilled when it doubles (DeepSpeed's hysteresis)."""
    min_scale: float = 1.0
    """The scale's floor (DeepSpeed's min_loss_scale); in train rl, overflows at the floor count toward
    --train.max_skipped_steps (those before are the scale's search for its size)."""


@dataclass(frozen=True)
class ActorConfig:
    """The policy being trained: model, dtypes, optimizer, schedule and policy loss."""

    model_name_or_path: str = "smollm2"
    """HF folder, a .gguf file, or `smollm2` (the packaged SmolLM2-135M-Instruct, converted once)."""
    config_overrides: str | None = None
    """A JSON object of model-config fields set on the policy's config before its weights load (verl's
    model.override_config), e.g. '{"max_position_embeddings": 32768, "attention_dropout": 0.0}'; each key
    must be a field of the config; an object value is merged into a dict field (rope_scaling) or a sub-config.
    The reference model and a vLLM engine (its hf_overrides) load with them too. Causal LMs only; not with
    the HF engines of Ray rollout workers (--distributed.backend ray, --rollout.engine hf). none = the
    folder's config."""
    dtype: str = "float32"
    """Parameter dtype: float32, bfloat16 or float16. bfloat16 and float16 keep float32 master weights and
    gradient sums in the optimizer (trainers.learner), as DeepSpeed's bf16 / fp16 modes; with --actor.autocast
    of the same dtype the norm weights and biases stay float32 (they move as under autocast); bfloat16's hf
    engine decodes with the bf16 matrices, refreshed after every optimizer step; under --fsdp.enable bfloat16
    (float16) becomes float32 sharded parameters gathered in bf16 (fp16), norm weights included, for compute
    (--fsdp.mixed_precision true). float16 (GPUs without bf16: V100, T4) needs --actor.autocast float16 or none
    and scales the loss (--train.loss_scale.*), under FSDP too; on a CPU without float16 matmul units
    (AVX512-FP16 / AMX-FP16) large float16 matmuls run far slower than float32."""
    autocast: str | None = "bfloat16"
    """Compute dtype for forward passes (torch.autocast on --actor.device's type): bfloat16, float16 (with
    loss scaling, --train.loss_scale.*) or float32; none = the parameter dtype;
    auto = bfloat16 where it is faster than float32 (a ~0.2 s matmul probe on the CPU; a GPU computing in bf16
    natively, compute capability 8.0 on), float16 on an older GPU (T4, V100; under --fsdp.enable too), else
    none (the choice is printed in one line). bfloat16 on a GPU that only emulates it is warned of."""
    device: str = "auto"
    """Where the policy, reference, critic, reward model and the hf engine run: auto (CUDA when available,
    else the CPU), cpu, cuda or cuda:N. Batches are built on the CPU and moved to it per micro-batch."""
    gradient_checkpointing_enable: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (transformers'
    non-reentrant gradient checkpointing): the same gradients, less activation memory, one more forward per update."""
    disable_dropout: bool = True
    """Train the policy and the critic without the dropout their config sets (GPT-2, Seed-OSS): rollouts
    and reference passes run without it, so on-policy ratios are exactly 1 only without it in the update
    too (TRL's disable_dropout). The saved config keeps its rates; LoRA's own dropout (--ds.lora.dropout)
    stays. false = the config's dropout in every training-mode forward."""
    optim: str = "adam"
    """Optimizer: adam (AdamW for every parameter) or muon (Muon for the hidden weight matrices, AdamW for
    the rest; --actor.muon.*). Gradient clipping (--actor.max_norm) runs on the raw gradients first."""
    adam: AdamConfig = field(default_factory=AdamConfig)
    muon: MuonConfig = field(default_factory=MuonConfig)
    freezing_steps: int = 0
    """Critic warm-up (PPO with --algo.advantage.estimator gae): for the first N RL steps only the critic
    is updated, the actor stays as it is (its optimizer and schedule do not step); 0 = off."""
    lr_scheduler: str = "cosine_with_min_lr"
    """Learning-rate schedule after warmup: constant, linear (to 0), cosine (to 0) or cosine_with_min_lr."""
    lr_warmup_ratio: float = 0.0
    """Fraction of all optimizer steps spent in linear warmup (read when --actor.lr_warmup_steps is -1)."""
    lr_warmup_steps: int = -1
    """Linear warmup over this many optimizer steps (not RL steps: one RL step takes
    --rollout.batch_size * n_samples_per_prompt / --train.batch_size * max_epochs of them); 0 = no warmup;
    -1 = --actor.lr_warmup_ratio of all optimizer steps. The critic's schedule follows the actor's."""
    min_lr_ratio: float = 0.1
    """cosine_with_min_lr decays to lr * min_lr_ratio."""
    max_norm: float = 1.0
    """Gradient-norm clipping (0 disables)."""
    eps_clip_low_high: tuple[float, float] = (0.2, 0.2)
    """PPO clip range [1 - low, 1 + high] (DAPO's clip-higher with high > low)."""
    dual_clip: float | None = None
    """Dual-clip PPO (Ye et al. 2020): with a negative advantage A, the token's loss is at most
    -dual_clip * A; must be > 1 (none = off)."""
    mask_truncated_completions: bool = False
    """Samples cut at the token budget (finish reason length) train on nothing: their tokens leave
    the loss, while their rewards still count in their group's baseline (TRL's
    mask_truncated_completions; DAPO's overlong filtering)."""
    policy_loss_type: str = "ppo"
    """The policy loss (docs/algorithms.md has each formula): ppo (clipped, one ratio per token), gspo
    (clipped, one ratio per sequence), cispo (clipped detached weight on REINFORCE), sapo (soft gate),
    clip_cov / kl_cov (entropy-preserving, on high-covariance tokens), gmpo (geometric mean of
    log-clipped token ratios) or vespo (Gamma weight of the sequence ratio)."""
    sapo_temperatures: tuple[float, float] = (1.0, 1.05)
    """sapo: the gate's temperatures (tau where the advantage is positive, tau where it is not); TRL's
    sapo_temperature_pos / _neg."""
    clip_cov_ratio: float = 2e-4
    """clip_cov: the share of a micro-batch's tokens whose gradient is cut (verl's clip_ratio)."""
    clip_cov_bounds: tuple[float, float] = (1.0, 5.0)
    """clip_cov: the covariance range (LOW, HIGH) of the tokens that may be cut (verl's clip_cov_lb / _ub)."""
    kl_cov_ratio: float = 2e-4
    """kl_cov: the share of a micro-batch's tokens, those of largest covariance, that get the KL penalty."""
    kl_cov_coef: float = 1.0
    """kl_cov: the penalty's coefficient on |logp - old logp| (verl's ppo_kl_coef)."""
    vespo_k: tuple[float, float] = (2.0, 3.0)
    """vespo: the Gamma weight's shape k (advantage >= 0, advantage < 0); TRL's vespo_k_pos / _neg."""
    vespo_lambda: tuple[float, float] = (3.0, 2.0)
    """vespo: the Gamma weight's rate lambda (advantage >= 0, advantage < 0); TRL's vespo_lambda_pos / _neg."""
    loss_agg_mode: str = "token_mean"
    """How per-token losses are averaged into one number (docs/algorithms.md); counts span the whole
    optimizer step."""
    entropy_coef: float = 0.0
    """Entropy bonus coefficient (loss -= coef * entropy)."""
    aux_loss_coef: float = 0.0
    """Mixture-of-experts policies: add this times the routers' load-balancing loss (Switch / Mixtral's,
    transformers' aux_loss) to each micro-batch's loss; the experts' load is logged (moe/*) either way."""
    routing_replay: bool = False
    """Mixture-of-experts policies: routing replay (R3, Ma et al. 2025): the hf engine records which experts
    each router chose for every token, and the old-logprob and update forwards route each token to those
    experts, the weights recomputed from the router's logits (its gradient kept); tokens without recorded
    experts (the vllm engine, compiled decode steps) keep the router's own choice, said once in the log.
    Logs moe/replay_tokens and moe/routing_mismatch (docs/moe.md). slime's --use-rollout-routing-replay."""
    ema_beta: float | None = None
    """Keep an EMA of the policy's weights, updated after each optimizer step and saved as an HF folder
    `ema/` beside `final/` at the end (OpenRLHF --enable_ema --ema_beta), e.g. 0.992."""
    freeze_visual_encoder: bool = False
    """A vision-language policy: its vision tower gets no gradients (it stays bit for bit as loaded; the
    projector and the language model train); the reference shares the frozen tower's values; the
    critic's tower (gae) is frozen too; with LoRA the tower holds no adapters."""


@dataclass(frozen=True)
class CriticConfig:
    """The value model of PPO with --algo.advantage.estimator gae."""

    model_name_or_path: str | None = None
    """Backbone of the critic for gae (a reward-model folder: its backbone and score head); defaults to the actor's."""
    optim: str = "adam"
    """The critic's optimizer: adam or muon (as --actor.optim; --critic.muon.*)."""
    adam: AdamConfig = field(default_factory=lambda: AdamConfig(lr=9e-6))
    muon: MuonConfig = field(default_factory=MuonConfig)
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
class ReasoningGymRewardConfig:
    """builtin:reasoning_gym: how a task's score becomes the reward (see docs/agents.md)."""

    partial_credit: bool = True
    """Keep the partial credit a reasoning-gym task gives (e.g. a sudoku's share of right cells); false:
    reward 1 only where the task scores the answer 1, else 0. Some tasks give partial credit to a constant
    answer (time_intervals, rectangle_count, polynomial_equations give "0" 0.3 to 0.95 on some entries),
    which a policy can learn instead of the task."""


@dataclass(frozen=True)
class RewardConfig:
    """Where rewards come from: a reward function, reward servers or a reward model; shaping."""

    remote_url: str | None = None
    """A Python file defining reward_func(queries, prompts, labels, **kwargs) (or TRL's or verl's contract;
    FILE.py:NAME names the function, as verl's custom_reward_function.name), builtin:NAME (math, code,
    reasoning_gym), or http(s):// reward server URLs (comma-separated: requests are sharded across them)."""
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
    stop_properly_penalty_coef: float | None = None
    """ProRL's penalty for responses that did not stop properly (finish reason length: cut at
    --rollout.max_new_tokens; an agent's episode cut short by its token or turn budget, see docs/agents.md):
    in [0, 1] their reward is multiplied by it, below 0 it is their reward (e.g. -0.5). Applied after the
    overlong penalty; none: off."""
    normalize: bool = False
    """Normalise rewards by running mean and std (updated every rollout)."""
    clip_range: tuple[float, float] | None = None
    """Clip the (group-shaped) scalar reward to [low, high]."""
    timeout: float | None = 300.0
    """Seconds one call of the reward function may take before the run stops; the call then runs in a
    worker thread. none: no limit, called in the main thread (for functions that use signal.alarm)."""
    code: CodeRewardConfig = field(default_factory=CodeRewardConfig)
    """builtin:code settings."""
    reasoning_gym: ReasoningGymRewardConfig = field(default_factory=ReasoningGymRewardConfig)
    """builtin:reasoning_gym settings."""


@dataclass(frozen=True)
class DataConfig:
    """The prompt dataset of training."""

    prompt_dataset: str | None = None
    """Prompts: a .jsonl / .json / .parquet / .csv / .arrow file, a datasets folder (save_to_disk, or a
    folder of data files), a hub dataset name (org/name; org/name@dir for a data dir), or a reasoning-gym
    task, reasoning_gym:TASK[:size=N][:seed=S][:OPTION=VALUE] (its entries generated). A local path wins
    over a hub name.
    Several, comma-separated (a.jsonl,b.jsonl): read as one, in order, or mixed by --data.prompt_probs."""
    prompt_probs: str | None = None
    """Mix the comma-separated datasets of --data.prompt_dataset with these comma-separated probabilities
    (each > 0, summing to 1; e.g. 0.7,0.3): each next prompt comes from a dataset drawn with them, a dataset
    that runs out starts again, until every one was read to its end (OpenRLHF's --prompt_data_probs, seeded
    by --train.seed); none = concatenate them."""
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
    labels. A dotted path reads nested columns: reward_model.ground_truth (verl's data)."""
    apply_chat_template: bool = False
    """Render each prompt with the tokenizer's chat template (as one user message, or the record's
    message list)."""
    input_template: str | None = None
    """A format string with one {} around the prompt, e.g. "Question: {} Answer:" (without a chat
    template)."""
    max_samples: int | None = None
    """Use at most this many prompts of the dataset (none: all); of several datasets, at most this many of
    each before they are mixed, and of the mix."""
    prompt_max_len: int = PROMPT_MAX_LEN
    """Prompts longer than this many tokens are skipped (counted and logged) or cut (--data.truncation);
    image tokens count. Lowered (said in one line) to fit a model with learned absolute positions (GPT-2,
    OPT), whose responses also end at its last position."""
    truncation: str = "skip"
    """A prompt over --data.prompt_max_len tokens: skip (counted and logged), error (stop, naming the record),
    or cut to fit (verl's data.truncation): left keeps its end, right its start, middle both ends (half
    each). Only the prompt's own text is cut (a chat's last user message), in tokens; the chat template's
    tokens, the input template and earlier messages stay whole. Text prompts only; not with
    tool-calling, text-environment or agent-function episodes (they render the record again, uncut)."""
    image_key: str | None = None
    """Record key of a prompt's images (paths, URLs, bytes or a datasets Image feature; one or a list) for a
    vision-language model (docs/vision.md); none = `images`, else `image`, where the record has one."""
    max_images_per_prompt: int = 1
    """Most images one prompt may hold; a record with more is refused before the model loads. In agent
    episodes, the images of the whole episode (the prompt's and those the environment shows)."""


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
    repetition_penalty: float = 1.0
    """CTRL's repetition penalty (transformers', vLLM's and TRL's GRPOConfig `repetition_penalty`): a token already in
    the prompt or the response has its logit divided by it where positive, multiplied where negative, when the
    next token is chosen; the hf engine's recorded logprob stays the policy's (as with top-k / top-p), vLLM's
    processed logprobs include it. 1 = off; > 1 discourages repeats."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a completion besides the tokenizer's EOS (e.g. 13,198)."""
    max_batch_size: int = 128
    """Largest number of sequences decoded together (memory bound)."""
    num_workers: int = 1
    """Rollout worker actors with --distributed.backend ray (each an engine: a policy copy behind the HF
    engine, or a vLLM engine; OpenRLHF's --vllm_num_engines on the ray backend)."""
    engine: str = "hf"
    """Generation engine: hf (transformers, CPU or GPU) or vllm (`pip install 'rlhfkit[vllm]'`; see docs/scaling.md)."""
    compile_decode: bool = False
    """hf engine: decode steps under torch.compile over a static KV cache, compiled once per process and
    model (CUDA graphs on CUDA, untested on a GPU so far). Off on the CPU, with one logged line: there the
    compiled step measured 1.05x the eager loop on SmolLM2 after a first compile of 40-90 s
    (docs/performance.md). Falls back to the eager loop with one logged line where it cannot be built."""
    keep_kv_across_turns: bool = True
    """hf engine, multi-turn episodes (agents, tools, text environments): keep an episode's KV cache
    from one turn to the next, so a turn prefills only its new tokens (feedback, tool results), not
    the whole history. In fp32 the same tokens as without and logprobs equal up to float rounding;
    under bf16 autocast the history is rounded differently, so a near-tie may go the other way
    (docs/performance.md). Full-attention models that take position ids, without
    --rollout.compile_decode; freed as episodes finish and at every weight sync."""


@dataclass(frozen=True)
class AdvantageConfig:
    """The advantage estimator (docs/algorithms.md has each formula)."""

    estimator: str = "group_norm"
    """gae (PPO with a critic), reinforce (REINFORCE++), reinforce_baseline, rloo, group_norm
    (GRPO), dr_grpo, group_mean_batch_std (the group's mean, the batch's std: TRL's
    scale_rewards=batch)."""
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
    """An agent file (AgentInstance / AgentExecutor, OpenRLHF's contract, or an `async def agent(client,
    prompt, label, **row)`), builtin:calculator, builtin:guess, or verifiers:ENV_ID (a verifiers environment,
    its rubric the reward; without --data.prompt_dataset its own dataset); rewards then come from the agent."""
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
    """How the model writes tool calls: hermes (Qwen2.5/Qwen3/Hermes), llama3_json, qwen3_coder
    (Qwen3-Coder/Qwen3.5+/Nemotron 3), glm45 (GLM-4.5+), mistral (before tokenizer v11), mistral_v11
    ([TOOL_CALLS]name[ARGS]{...}); none = the tokenizer's response template, else read off its chat template."""
    tool_calls_per_episode: int = 8
    """Most tool calls run per episode (further calls get an error result)."""
    tool_timeout: float = 10.0
    """Seconds a tool call may take before its result is an error."""
    tool_result_tokens: int = 256
    """Most tokens of one tool result (longer results are cut)."""
    env: str | None = None
    """A text environment for the episodes: gem:ENV_ID (GEM, e.g. gem:game:GuessTheNumber-v0-easy),
    textarena:ENV_ID (a one-player TextArena game, e.g. textarena:GuessTheNumber-v0), skyrl:ENV_ID (a SkyRL-Gym
    environment, e.g. skyrl:gsm8k, made per episode with the row as its extras), openenv:URL (an OpenEnv
    environment server, a session per episode), or FILE_OR_MODULE:Class
    (gymnasium-style: reset(seed=None), step(action) -> observation, reward, terminated, truncated, info; or a
    SkyRL-Gym BaseTextEnv subclass). Its observations come back as user turns of the chat template,
    its rewards are the episode's (summed); the row's seed column seeds reset. With --agent.tools too."""
    on_rerender: str = "keep"
    """What tool-calling and text-environment episodes do when the chat template re-renders the
    history so that it is no longer the tokens sampled (Qwen3 drops earlier turns' <think>): keep
    (train the sampled tokens as one trajectory; counted in tools/rerender) or segment (the tokens
    so far become one finished segment and the next turn samples from the re-rendered
    conversation, a new segment; all segments share the episode's reward and count once in the
    group baseline; counted in tools/segments)."""
    env_reward_weight: float | None = None
    """When the environment gives rewards (--agent.env, --agent.func_path, an environment_factory
    with get_reward) and a reward function is given too (--reward.*, reward_fn=): reward = this x
    the environment's + the function's (0: the function's alone). none: giving both is refused."""
    timeout: float = 300.0
    """Seconds one episode of an agent function (`async def agent(client, prompt, label, **row)`)
    may run, besides the time its calls wait on the engine; past it the episode is cancelled and
    dropped from the batch."""
    max_calls: int = 64
    """Most OpenAI-API calls one episode of an agent function may make (more get HTTP 429)."""
