"""`rlhfkit eval`: pass@k and maj@k of a model on an eval dataset, with a verifier.

Takes the flags of `rlhfkit train rl` (the model, the data keys and the --eval.* settings):

  rlhfkit eval --actor.model_name_or_path runs/rl/final --eval.dataset test.jsonl \\
      --data.input_key question --data.label_key answer --eval.verifier builtin:math \\
      --eval.n_samples 8 --eval.temperature 0.7 --eval.k 1,4,8 --ckpt.output_dir runs/eval

Draws --eval.n_samples completions per prompt (--rollout.max_new_tokens each) and reports
eval/pass@k and eval/maj@k from --eval.verifier (default: the training reward,
--reward.remote_url or --reward.model_name_or_path), plus eval/reward and eval/accuracy from the
training reward when one is given. With --agent.tools (or --agent.func_path) each sample is a whole
episode of up to --agent.max_turns turns, scored as in training (an agent that gives its own rewards needs no
reward flag); the tool counters are reported too (eval/tool_calls, eval/episodes_with_call,
eval/tools/valid_call_rate, eval/tools/NAME/calls, ...). Writes <output_dir>/eval.json (metrics
and settings) and <output_dir>/eval_samples.jsonl (one line per sample: prompt, label, response,
correct, answer; with tools also the conversation as messages, which `rlhfkit view OUT --file
eval_samples.jsonl` shows turn by turn).

With --agent.func_path an agent function (`async def agent(client, prompt, label, **row)`, written
against the OpenAI API), it runs --eval.n_samples episodes per prompt through rlhfkit's endpoint at
--eval.temperature and reports eval/reward, the agent's mean reward (a dropped episode counts 0),
eval/dropped, and eval/NAME for each value NAME the agent returns in extra_logs (its mean, likewise);
each row of eval_samples.jsonl holds the episode's prompt, label, reward, extra_logs and reply:

  rlhfkit eval --actor.model_name_or_path runs/agent/final --agent.func_path agent.py \\
      --eval.dataset heldout.jsonl --data.label_key label --ckpt.output_dir runs/eval
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from rlhfkit.api import vision as V
from rlhfkit.api.builder import (
    build_executor,
    fit_to_positions,
    label_reward,
    load_reward,
    prompt_options,
    resolve_autocast,
    run_device,
    sampling_params,
    token_budget,
)
from rlhfkit.api.engines import build_engine
from rlhfkit.api.run_folder import create_run_dir, make_evaluator
from rlhfkit.config import RLConfig, to_dict
from rlhfkit.config.rl_checks import config_overrides
from rlhfkit.data.prompts import check_prompts, load_prompts, tokenize_prompts
from rlhfkit.errors import ConfigError
from rlhfkit.models.host import apply_host_settings
from rlhfkit.models.loading import load_policy
from rlhfkit.tracking.progress import set_log_level


def run(argv: list[str]) -> int:
    cfg = resolve_autocast(RLConfig.from_args(argv))
    set_log_level(cfg.logger.log_level)
    e = cfg.eval
    if not e.dataset:
        raise ConfigError("--eval.dataset is required (a .jsonl/.json/.parquet file, a datasets folder or a hub "
                          "dataset name)")
    executor = build_executor(cfg)  # an agent file or tools: episodes (a bad file fails before the model)
    vision = V.policy_folder(cfg)  # a vision-language policy: its prompts' images are checked before it loads
    if vision is not None:
        V.check_executor(cfg, executor, vision)
    if hasattr(executor, "fallback_reward_fn"):  # an agent function through the endpoint
        return run_agent_eval(cfg, executor, vision)
    if not (e.verifier or has_reward(cfg) or executor.provides_rewards):
        raise ConfigError("nothing to score with: pass --eval.verifier (builtin:math or a reward file) "
                          "and/or --reward.remote_url or --reward.model_name_or_path")
    options = _checked_options(cfg, vision)
    reward_fn = training_reward(cfg)
    verifier = load_reward(e.verifier) if e.verifier else None  # fail fast, before the model
    out, t0, engine, tokenizer, items, skipped = _load(cfg, options, vision, executor)
    evaluator = make_evaluator(cfg, items, reward_fn, verifier, executor)
    metrics, rows = evaluator.evaluate(engine, tokenizer)
    return _report(cfg, out, t0, metrics, rows, len(evaluator.items), skipped,
                   f"{cfg.actor.model_name_or_path} on {len(evaluator.items)} prompts x {e.n_samples} samples")


def run_agent_eval(cfg: RLConfig, executor, vision: str | None = None) -> int:
    """`rlhfkit eval --agent.func_path AGENT.py`: the agent function's mean reward on --eval.dataset."""
    from rlhfkit.agents.endpoint.runner import evaluate_agent  # noqa: PLC0415 - the agents extra

    e = cfg.eval
    options = _checked_options(cfg, vision)
    if has_reward(cfg):
        executor.fallback_reward_fn = training_reward(cfg)
    out, t0, engine, tokenizer, items, skipped = _load(cfg, options, vision, executor)
    params = dataclasses.replace(sampling_params(cfg), temperature=e.temperature, top_p=e.top_p, top_k=e.top_k,
                                 n=e.n_samples)
    metrics, rows = evaluate_agent(executor, engine, tokenizer, items, params, token_budget(cfg, multi_turn=True),
                                   seed=cfg.train.seed)
    return _report(cfg, out, t0, metrics, rows, len(items), skipped,
                   f"{cfg.actor.model_name_or_path} with agent {cfg.agent.func_path} on {len(items)} prompts x "
                   f"{e.n_samples} episodes")


def has_reward(cfg: RLConfig) -> bool:
    return cfg.reward.remote_url is not None or cfg.reward.model_name_or_path is not None


def training_reward(cfg: RLConfig):
    """The training reward of --reward.remote_url or --reward.model_name_or_path (a reward model scoring on
    --actor.device, --train.micro_batch_size samples a pass; a process reward model's scalar is its weakest
    step's P(good): eval reads no per-token reward, whatever the estimator), or None."""
    if not has_reward(cfg):
        return None
    return load_reward(cfg.reward, cfg.train.micro_batch_size, run_device(cfg))


def _checked_options(cfg: RLConfig, vision: str | None = None) -> dict:
    """`load_prompts`' options for --eval.dataset (its first --eval.max_samples prompts, unshuffled), the
    dataset checked with them: a bad file or key fails fast, before the model. A vision-language policy's
    prompts are checked with their images (every image decoded); a text policy's may hold none."""
    V.check_data(cfg, cfg.eval.dataset, vision is not None, eval=True, shuffle=False)
    options = {**prompt_options(cfg, eval=True), "shuffle_seed": None}
    if vision is None:
        check_prompts(cfg.eval.dataset, **options, labels_for=label_reward(cfg, eval=True))
    return options


def _load(cfg: RLConfig, options: dict, vision: str | None = None, executor=None):
    """The output folder (a bad path fails before the model loads), the start time, the policy's engine,
    its tokenizer and the tokenized eval prompts (with how many were skipped as too long). A
    vision-language policy (`vision`: its folder) runs on the vision engine, its prompts rendered and
    encoded by its processor with their images, which `executor` gets too (as in `train rl`)."""
    apply_host_settings(cfg.train.num_threads, cfg.train.keep_freed_memory)
    device = run_device(cfg)  # a CUDA device that is not there fails before the model loads
    out = create_run_dir(Path(cfg.ckpt.output_dir), None, None)
    t0 = time.perf_counter()
    policy, tokenizer = load_policy(cfg.actor.model_name_or_path, cfg.actor.dtype,
                                    config_overrides=config_overrides(cfg))
    policy.to(device)
    if vision is not None:
        processor = V.processor_of(vision)
        V.attach_processor(processor, cfg.data.max_images_per_prompt, executor)
        items, skipped = V.prompts(cfg, cfg.eval.dataset, processor, eval=True, shuffle=False)
        return out, t0, V.build_engine(policy, tokenizer, cfg, processor), tokenizer, items, skipped
    engine = build_engine(policy, tokenizer, cfg)
    cfg = fit_to_positions(cfg, policy, "prompt_max_len")
    examples = load_prompts(cfg.eval.dataset, tokenizer=tokenizer, **options)
    items, skipped = tokenize_prompts(examples, tokenizer, cfg.data.prompt_max_len, cfg.data.input_key,
                                      cfg.data.truncation, cfg.data.input_template)
    return out, t0, engine, tokenizer, items, skipped


def _report(cfg: RLConfig, out: Path, t0: float, metrics: dict, rows: list, prompts: int, skipped: int,
            what: str) -> int:
    """Writes eval.json (metrics and settings) and eval_samples.jsonl, and prints the metrics."""
    (out / "eval.json").write_text(json.dumps(
        {"metrics": metrics, "prompts": prompts, "skipped_prompts": skipped,
         "seconds": round(time.perf_counter() - t0, 1), "config": to_dict(cfg)}, indent=2))
    (out / "eval_samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{what} (temperature {cfg.eval.temperature}):")
    for k, v in metrics.items():
        print(f"  {k:<20} {v:.4f}")
    print(f"wrote {out / 'eval.json'} and {out / 'eval_samples.jsonl'}")
    return 0
