"""The converters of verl's overrides (config/verl.py): Hydra's value syntax, verl's batch arithmetic and
verl's names of estimators, KL estimators, aggregation modes and losses as rlhfkit's flags. Each converter is
`(values, given) -> {our dotted name: raw value}` (config/parse.py's `Alias.convert`); `given` maps every
override on the command line (and verl's defaults, config/verl.py's VERL_DEFAULTS) to its values."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import yaml

from rlhfkit.errors import ConfigError

log = logging.getLogger("rlhfkit")
A, RO, R = "actor_rollout_ref.actor.", "actor_rollout_ref.rollout.", "reward_model."


# ------------------------------------------------------------------ values in Hydra's syntax
def hydra_value(text: str) -> str:
    """A Hydra override's value as rlhfkit's flags take it: lists comma-joined, null -> none, booleans
    lower-case, quotes removed (`'["console","wandb"]'` -> `console,wandb`)."""
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text.strip()
    if isinstance(value, (list, tuple)):
        return ",".join(hydra_value(str(v)) if not isinstance(v, str) else v for v in value)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value == {}:
        return "{}"
    if isinstance(value, dict):
        raise ConfigError(f"{text!r}: a mapping value is not read; set its keys one by one (KEY.SUB=VALUE)")
    return str(value)


def flag_on(given: Mapping[str, list], key: str, default: bool = False) -> bool:
    vals = given.get(key)
    return default if vals is None else str(vals[0]).lower() in ("true", "1", "yes")


def flag_value(given: Mapping[str, list], key: str, default: str | None = None) -> str | None:
    vals = given.get(key)
    return default if vals is None or vals[0] in ("none",) else str(vals[0])


# ------------------------------------------------------------------ converters: the batch arithmetic
def mini_batch(vals, given):
    """verl's mini-batch counts prompts; rlhfkit's optimizer step counts samples: mini x rollout.n."""
    n = int(flag_value(given, RO + "n", "1"))
    return {"train.batch_size": str(int(vals[0]) * n)}


def global_micro(vals, given):
    """verl's deprecated global micro-batch: divided by the GPU count, as verl does."""
    if vals[0] == "none":
        return {}
    gpus = int(flag_value(given, "trainer.n_gpus_per_node", "8")) * int(flag_value(given, "trainer.nnodes", "1"))
    return {"train.micro_batch_size": str(max(1, int(vals[0]) // gpus))}


def same_as_actor(actor_key: str, default: str):
    def convert(vals, given):
        theirs = flag_value(given, actor_key, default)
        if vals[0] != "none" and vals[0] != theirs:
            raise ConfigError(f"{vals[0]} differs from {actor_key} ({theirs}): rlhfkit updates the critic on the "
                              "actor's mini-batches and epochs; set only the actor's")
        return {}
    return convert


# ------------------------------------------------------------------ converters: the algorithm
ESTIMATORS = {"gae": "gae", "grpo": "group_norm", "grpo_vectorized": "group_norm", "rloo": "rloo",
              "rloo_vectorized": "rloo", "reinforce_plus_plus": "reinforce",
              "reinforce_plus_plus_baseline": "reinforce_baseline"}
KL_TYPES = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
AGG_MODES = {"token-mean": "token_mean", "seq-mean-token-sum": "seq_mean_token_sum",
             "seq-mean-token-mean": "seq_mean_token_mean", "seq-mean-token-sum-norm": "seq_mean_token_sum_norm"}
LOSS_MODES = {"vanilla": "ppo", "gspo": "gspo", "clip_cov": "clip_cov", "kl_cov": "kl_cov", "geo_mean": "gmpo",
              "cispo": "cispo", "sapo": "sapo"}
SCHEDULES = {"constant": "constant", "cosine": "cosine_with_min_lr"}


def pick(table: dict[str, str], value: str, what: str) -> str:
    if value not in table:
        raise ConfigError(f"{value!r}: rlhfkit has no such {what}; valid here: {', '.join(table)}")
    return table[value]


def estimator(vals, given):
    name = pick(ESTIMATORS, vals[0], "advantage estimator (remax, opo, gpg, grpo_passk and the optimal "
                                      "token baselines are not built)")
    if name == "group_norm" and not flag_on(given, "algorithm.norm_adv_by_std_in_grpo", True):
        name = "dr_grpo"  # mean-centred, not divided by the group's std
    return {"algo.advantage.estimator": name}


def kl_settings(vals, given):
    """All of verl's KL keys read together: the KL loss (use_kl_loss, kl_loss_coef, kl_loss_type) or the KL
    penalty in the reward (use_kl_in_reward, kl_ctrl.kl_coef, kl_penalty, an adaptive kl_ctrl)."""
    loss, in_reward = flag_on(given, A + "use_kl_loss"), flag_on(given, "algorithm.use_kl_in_reward")
    if loss and in_reward:
        raise ConfigError("use_kl_loss=True and algorithm.use_kl_in_reward=True: rlhfkit applies the KL in one place "
                          "(--algo.kl.use_loss true: the loss; false: the reward); choose one")
    if not (loss or in_reward):
        return {"algo.kl.init_coef": "0"}
    if loss:
        coef, kind = flag_value(given, A + "kl_loss_coef", "0.001"), flag_value(given, A + "kl_loss_type", "low_var_kl")
    else:
        coef = flag_value(given, "algorithm.kl_ctrl.kl_coef", "0.001")
        kind = flag_value(given, "algorithm.kl_penalty", "kl")
    out = {"algo.kl.use_loss": str(loss).lower(), "algo.kl.init_coef": coef,
           "algo.kl.estimator": pick(KL_TYPES, kind, "KL estimator (abs, full and the straight-through + forms "
                                                      "are not built)")}
    if in_reward and flag_value(given, "algorithm.kl_ctrl.type", "fixed") == "adaptive":
        out["algo.kl.target"] = flag_value(given, "algorithm.kl_ctrl.target_kl", "0.1")
        out["algo.kl.horizon"] = flag_value(given, "algorithm.kl_ctrl.horizon", "10000")
    elif flag_value(given, "algorithm.kl_ctrl.type", "fixed") not in ("fixed", "adaptive"):
        raise ConfigError("algorithm.kl_ctrl.type: fixed or adaptive")
    return out


def clip_range(vals, given):
    """verl's clip range: clip_ratio_low / clip_ratio_high (0.2 each by default, in `given` from VERL_DEFAULTS),
    clip_ratio only where one of them is null, as verl's policy losses read them."""
    both = flag_value(given, A + "clip_ratio", "0.2")
    return {"actor.eps_clip_low_high": f"{flag_value(given, A + 'clip_ratio_low', both)} "
                                       f"{flag_value(given, A + 'clip_ratio_high', both)}"}


def pair(low_key: str, high_key: str, low: str, high: str, field: str):
    return lambda vals, given: {field: f"{flag_value(given, low_key, low)} {flag_value(given, high_key, high)}"}


def named(table: dict[str, str], field: str, what: str):
    return lambda vals, given: {field: pick(table, vals[0], what)}


def scheduler(field: str):
    def convert(vals, given):
        return {} if vals[0] == "none" else {field: pick(SCHEDULES, vals[0], "learning-rate schedule")}
    return convert


def warmup_steps(field: str):
    """optim.lr_warmup_steps onto `field`: N warmup steps (0: none); verl's -1 (and null) read lr_warmup_steps_ratio."""
    return lambda vals, given: {} if vals[0] == "none" else {field: vals[0]}


def truncation(vals, given):
    """data.truncation with data.filter_overlong_prompts: verl drops over-long prompts first where the filter is on
    (skip); otherwise it cuts them (left, right, middle) or stops (error, its default)."""
    if flag_on(given, "data.filter_overlong_prompts"):
        return {"data.truncation": "skip"}
    side = flag_value(given, "data.truncation", "error")
    return {"data.truncation": pick({k: k for k in ("error", "left", "right", "middle")}, side, "truncation")}


def _typed(text: str):
    """A Hydra value as JSON takes it: none -> null, true/false, an int, a float, else the string."""
    if text in ("none", "true", "false"):
        return {"none": None, "true": True, "false": False}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def model_overrides(vals, given):
    """+actor_rollout_ref.model.override_config.KEY=VALUE (KEY.SUB=VALUE nested): one JSON object of them all,
    --actor.config_overrides."""
    prefix, out = "actor_rollout_ref.model.override_config.", {}
    for key, values in given.items():
        if key.startswith(prefix):
            *parents, leaf = key[len(prefix):].split(".")
            node = out
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = _typed(str(values[0]))
    return {"actor.config_overrides": json.dumps(out, sort_keys=True)} if out else {}


def rollout_is(vals, given):
    """verl's rollout importance sampling (token-level, truncated at rollout_is_threshold)."""
    mode = flag_value(given, "algorithm.rollout_correction.rollout_is")
    if mode is None:
        return {}
    if mode != "token":
        raise ConfigError(f"algorithm.rollout_correction.rollout_is={mode}: rlhfkit truncates per token (token); "
                          "for a sequence-level mask use --algo.advantage.is_correction_type seq-mask-tis")
    high = flag_value(given, "algorithm.rollout_correction.rollout_is_threshold", "2.0")
    return {"algo.advantage.is_correction_enable": "true", "algo.advantage.is_correction_type": "tis",
            "algo.advantage.is_correction_threshold": f"0 {high}"}


# ------------------------------------------------------------------ converters: rollout, eval, reward, logging
def engine(vals, given):
    name = vals[0]
    if name in ("vllm", "hf"):
        return {"rollout.engine": name}
    if name in ("sglang", "trtllm"):
        log.warning("%srollout.name=%s: rlhfkit generates with vLLM instead (--rollout.engine vllm)", RO[:-8], name)
        return {"rollout.engine": "vllm"}
    raise ConfigError(f"actor_rollout_ref.rollout.name={name}: vllm, sglang (generated with vllm) or hf")


def sampling(vals, given):
    greedy = not flag_on(given, RO + "do_sample", True)
    return {"rollout.temperature": "0" if greedy else flag_value(given, RO + "temperature", "1.0")}


def eval_sampling(vals, given):
    greedy = not flag_on(given, RO + "val_kwargs.do_sample", False)
    return {"eval.temperature": "0" if greedy else flag_value(given, RO + "val_kwargs.temperature", "0")}


def reward_model(vals, given):
    if not flag_on(given, R + "enable"):
        return {}
    return {"reward.model_name_or_path": flag_value(given, R + "model.path", "~/models/FsfairX-LLaMA3-RM-v0.1")}


def reward_function(vals, given):
    """custom_reward_function.path (and .name): `--reward.remote_url PATH`, or `PATH:NAME` when a name is given
    (without a path verl uses its default reward, whatever the name)."""
    path = flag_value(given, "custom_reward_function.path")
    if path is None:
        return {}
    name = flag_value(given, "custom_reward_function.name")
    return {"reward.remote_url": path if name is None else f"{path}:{name}"}


def overlong(vals, given):
    """DAPO's overlong penalty (`+reward_model.reward_kwargs.overlong_buffer_cfg.*`, with the dapo manager)."""
    cfg = R + "reward_kwargs.overlong_buffer_cfg."
    if not flag_on(given, cfg + "enable"):
        return {}
    return {"reward.overlong_buffer_len": flag_value(given, cfg + "len", "4096"),
            "reward.overlong_penalty_factor": flag_value(given, cfg + "penalty_factor", "1.0")}


def loggers(project: str, experiment: str):
    """trainer.logger: wandb logs to trainer.project_name / experiment_name (verl's defaults `project`,
    `experiment`); console and tensorboard are always on in rlhfkit."""
    def convert(vals, given):
        names = (flag_value(given, "trainer.logger", "console,wandb") or "").split(",")
        unknown = [n for n in names if n and n not in ("console", "wandb", "tensorboard")]
        if unknown:
            raise ConfigError(f"trainer.logger={','.join(unknown)}: rlhfkit logs to console, TensorBoard and wandb")
        if "wandb" not in names:
            return {}
        return {"logger.wandb.project": flag_value(given, "trainer.project_name", project),
                "logger.wandb.name": flag_value(given, "trainer.experiment_name", experiment)}
    return convert


def nested_key(field: str, key: str, default: str):
    """verl SFT's column `key` and its `*_dict_keys` path inside it as one dotted key (extra_info.question)."""
    def convert(vals, given):
        if flag_on(given, "data.multiturn.enable"):
            return {}
        path = flag_value(given, f"{key[:-4]}_dict_keys")
        column = flag_value(given, key, default)
        return {field: ".".join([column, *(path.split(",") if path else [])])}
    return convert


def multiturn(vals, given):
    """verl SFT's multi-turn data: the messages column is the input; every assistant turn is a target."""
    if not flag_on(given, "data.multiturn.enable"):
        return {}
    return {"data.input_key": flag_value(given, "data.multiturn.messages_key", "messages"), "data.output_key": "none"}


def files(field: str, single: bool = False):
    def convert(vals, given):
        if single and "," in vals[0]:
            raise ConfigError(f"{vals[0]}: rlhfkit evaluates on one dataset (--{field}); pass one file")
        return {field: vals[0]}
    return convert


def max_samples(field: str):
    return lambda vals, given: {field: "none" if vals[0] in ("-1", "none") else vals[0]}


def resume(vals, given):
    mode = vals[0]
    if mode not in ("auto", "disable", "resume_path"):
        raise ConfigError(f"trainer.resume_mode={mode}: auto, disable or resume_path")
    if mode == "resume_path":
        raise ConfigError("trainer.resume_mode=resume_path: rlhfkit resumes from <--ckpt.output_dir>/checkpoints "
                          "(trainer.default_local_dir) with resume_mode=auto")
    return {"ckpt.load_enable": "true" if mode == "auto" else "false"}




def norm_adv(vals, given):
    """algorithm.norm_adv_by_std_in_grpo: read with the estimator (False with grpo: dr_grpo)."""
    return estimator([flag_value(given, "algorithm.adv_estimator", "gae")], given)
