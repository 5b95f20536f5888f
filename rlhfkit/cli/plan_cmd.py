"""`rlhfkit plan`: the step arithmetic and a memory estimate of a `train rl` run, before any model loads.

Takes the flags (or --config) of `rlhfkit train rl`, plus two of its own:
  --plan.num_prompts N     the dataset size, when --data.prompt_dataset is not given
  --plan.prompt_tokens N   prompt length for the memory estimate (default --data.prompt_max_len)
  --plan.image_tokens N    a vision-language model whose images take a variable number of tokens (Qwen-VL,
                           SmolVLM / Idefics3 and InternVL tiles, Gemma 4): language-model tokens per image
                           (default 256: a 448 x 448 Qwen2-VL image); fixed-size models use their own
A multi-turn run's responses are its episodes' budget: actions and tool results or feedback
(config.plan.response_tokens). A vision-language model's estimate adds its vision tower and
projector to the weights (and, unless --actor.freeze_visual_encoder, to the gradients, optimizer
state and activations) and its image tokens (--data.max_images_per_prompt per prompt) to every prompt.
Reads only the model's config.json (no weights, no tokenizer; of a hub model, only that file).
Exit code 0; settings that do not fit together are errors (as in `train rl`), settings that fit
but look unintended are warnings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlhfkit.api.builder import label_reward, prompt_options, prompt_source
from rlhfkit.api.vision import data_options, policy_folder
from rlhfkit.config import RL_ALIASES, RLConfig, parse_config, validate
from rlhfkit.config.plan import RunPlan, plan_run, plan_warnings, response_tokens
from rlhfkit.config.verl import verl_values
from rlhfkit.core.advantages import ESTIMATORS
from rlhfkit.data.images import check_vision_prompts
from rlhfkit.data.prompts import check_prompts
from rlhfkit.errors import ConfigError
from rlhfkit.models.loading import DEFAULT_CACHE_DIR, SMOLLM2_NAME, read_config_json, resolve_model_file
from rlhfkit.models.memory import BYTES, SMOLLM2_CONFIG, GiB, count_params, memory_estimate
from rlhfkit.models.vision import is_vision_config, tower_activation_bytes, vision_sizes

PLAN_FLAGS = ("--plan.num_prompts", "--plan.prompt_tokens", "--plan.image_tokens")


def split_plan_flags(argv: list[str]) -> tuple[list[str], dict[str, int]]:
    """Take --plan.* flags out of argv: (the rest, {"num_prompts": N, "prompt_tokens": N})."""
    rest, own, i = [], {}, 0
    while i < len(argv):
        name, eq, val = argv[i].partition("=")
        if name in PLAN_FLAGS:
            if not eq:
                if i + 1 >= len(argv):
                    raise ConfigError(f"{name}: a value is required")
                val, i = argv[i + 1], i + 1
            try:
                own[name.split(".")[1]] = int(val)
            except ValueError:
                raise ConfigError(f"{name}: expected a whole number (got {val!r})") from None
        else:
            rest.append(argv[i])
        i += 1
    return rest, own


def model_config(name_or_path: str) -> tuple[dict | None, str]:
    """(config.json as a dict or None, where it came from)."""
    if name_or_path == "smollm2":
        cached = Path(DEFAULT_CACHE_DIR).expanduser() / SMOLLM2_NAME / "config.json"
        if cached.is_file():
            return json.loads(cached.read_text()), str(cached)
        return dict(SMOLLM2_CONFIG), "SmolLM2-135M-Instruct's known config (not converted yet)"
    p = Path(name_or_path)
    if p.suffix == ".gguf":
        return None, f"{p} is a GGUF file (no config.json): no memory estimate"
    config = resolve_model_file(name_or_path, "config.json")  # a hub model's config.json only, no weights
    if not config.is_file():
        raise ConfigError(f"--actor.model_name_or_path {name_or_path}: no config.json there; "
                          "give an HF model folder, a hub name (org/name), a .gguf file or smollm2")
    return read_config_json(config.parent), str(config)


def count_prompts(cfg: RLConfig, given: int | None) -> int | None:
    if given is not None:
        return given
    if not cfg.data.prompt_dataset:
        return None
    if policy_folder(cfg) is not None:  # a vision-language model: its prompts, images decoded
        return check_vision_prompts(prompt_source(cfg), **data_options(cfg))
    return check_prompts(prompt_source(cfg), **prompt_options(cfg), labels_for=label_reward(cfg))


def format_counts(cfg: RLConfig, plan: RunPlan) -> list[str]:
    r, t = cfg.rollout, cfg.train
    lines = [
        f"prompts per rollout batch      {plan.prompts_per_rollout}   (--rollout.batch_size)",
        f"samples per rollout            {plan.samples_per_rollout}   ({r.batch_size} prompts x "
        f"{r.n_samples_per_prompt} --rollout.n_samples_per_prompt)",
        f"micro-batches per opt. step    {plan.micro_batches_per_step}   (--train.batch_size {t.batch_size} / "
        f"--train.micro_batch_size {t.micro_batch_size})",
        f"optimizer steps per rollout    {plan.optimizer_steps_per_rollout}   ({plan.samples_per_rollout} / "
        f"{t.batch_size} x {t.max_epochs} --train.max_epochs)",
        f"dataset prompts                {plan.num_prompts}",
        f"rollouts per episode           {plan.rollouts_per_episode}   ({plan.num_prompts} // {r.batch_size})",
        f"optimizer steps per episode    {plan.optimizer_steps_per_episode}   (textbook formula: "
        f"{plan.seed002_update_steps_per_episode})",
        f"rollouts (RL steps) in total   {plan.total_rollouts}   ({t.num_episodes} episode(s)"
        + (f", capped by --train.max_steps {t.max_steps})" if t.max_steps is not None else ")"),
        f"optimizer steps in total       {plan.total_optimizer_steps}   (warmup {plan.warmup_steps})",
        f"samples generated in total     {plan.total_samples}",
    ]
    if plan.eval_points:
        shown = ", ".join(map(str, plan.eval_points[:8])) + (" ..." if len(plan.eval_points) > 8 else "")
        lines.append(f"evaluations after RL steps     {shown} (and before / after training)")
    return lines


def vision_terms(cfg: RLConfig, mcfg: dict, image_tokens: int | None) -> tuple[dict, dict, list[str]]:
    """A vision-language model's (text config, memory_estimate's extra arguments, lines to print)."""
    a, images = cfg.actor, cfg.data.max_images_per_prompt
    sizes = vision_sizes(mcfg, image_tokens)
    compute = BYTES[a.autocast or a.dtype]
    frozen = sizes["tower"] if a.freeze_visual_encoder else 0
    tower_act = 0 if frozen else tower_activation_bytes(sizes, cfg.train.micro_batch_size * images, compute)
    per_image = ("fixed by the model" if sizes["fixed_tokens"] else "--plan.image_tokens" if image_tokens
                 else "assumed: a 448 x 448 Qwen2-VL image; set --plan.image_tokens")
    lines = [f"vision tower                   {sizes['tower'] / 1e6:.2f}M params "
             f"({'frozen' if frozen else 'trained'}), projector {sizes['projector'] / 1e6:.2f}M",
             f"image tokens per prompt        {images * sizes['image_tokens']}   ({images} "
             f"--data.max_images_per_prompt x {sizes['image_tokens']} per image, {per_image})"]
    extra = dict(params=sizes["total"], frozen=frozen, extra_activations=tower_act)
    return {**sizes["text"], "image_tokens": images * sizes["image_tokens"]}, extra, lines


def format_memory(cfg: RLConfig, mcfg: dict, prompt_tokens: int, image_tokens: int | None = None) -> list[str]:
    a, r = cfg.actor, cfg.rollout
    compute = a.autocast or a.dtype
    extra, vision_lines = {}, []
    if is_vision_config(mcfg):
        mcfg, extra, vision_lines = vision_terms(cfg, mcfg, image_tokens)
        prompt_tokens += mcfg["image_tokens"]
    est = memory_estimate(
        mcfg, param_dtype=a.dtype, compute_dtype=compute, micro_batch_size=cfg.train.micro_batch_size,
        decode_batch=min(r.max_batch_size, r.batch_size * r.n_samples_per_prompt), prompt_len=prompt_tokens,
        max_new_tokens=response_tokens(cfg)[0], with_ref=cfg.algo.kl.init_coef > 0,
        with_critic=ESTIMATORS[cfg.algo.advantage.estimator].needs_critic, **extra,
    )
    params = extra.get("params") or count_params(mcfg)
    lines = [f"parameters                     {params / 1e6:.1f}M ({a.dtype}, compute {compute})", *vision_lines]
    for k in ("weights", "gradients", "optimizer", "activations", "autocast", "kv_cache", "peak"):
        lines.append(f"{k:<30} {est[k] / GiB:8.3f} GiB")
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    if ram and est["peak"] > ram:
        lines.append(f"warning: the estimated peak ({est['peak'] / GiB:.1f} GiB) exceeds this machine's memory "
                     f"({ram / GiB:.1f} GiB): lower --train.micro_batch_size or --rollout.max_batch_size")
    return lines


def run(argv: list[str]) -> int:
    argv, own = split_plan_flags(argv)
    cfg = parse_config(RLConfig, argv, aliases=RL_ALIASES, positional=verl_values)  # as train rl reads them
    batch = validate(cfg)  # once: the checks of RLConfig.from_args and the batch plan
    num_prompts = count_prompts(cfg, own.get("num_prompts"))
    print(f"plan for {cfg.actor.model_name_or_path} ({cfg.algo.advantage.estimator}), "
          f"nothing loaded but config.json\n")
    if num_prompts is None:
        print("(no --data.prompt_dataset / --plan.num_prompts: per-episode counts assume one rollout batch)")
        num_prompts = cfg.rollout.batch_size
    plan = plan_run(cfg, batch, num_prompts)
    print("\n".join(format_counts(cfg, plan)))
    mcfg, source = model_config(cfg.actor.model_name_or_path)
    prompt_tokens = own.get("prompt_tokens", cfg.data.prompt_max_len)
    print(f"\nmemory estimate ({source}; prompts of {prompt_tokens} tokens"
          f"{'' if 'prompt_tokens' in own else ' = --data.prompt_max_len, an upper bound; set --plan.prompt_tokens'}"
          f" + {response_tokens(cfg)[1]}):")
    if mcfg is not None:
        print("\n".join(format_memory(cfg, mcfg, prompt_tokens, own.get("image_tokens"))))
    warnings = plan_warnings(cfg, plan)
    for w in warnings:
        print(f"warning: {w}")
    if not warnings:
        print("\nno conflicting settings found")
    return 0
