"""The `rlhfkit` command (also `python -m rlhfkit`): `train rl|sft|rm|dpo|kto|prm|kd|opd|rs|iterative-dpo`,
`generate`, `lora merge`, `demo`, `plan`, `eval`, `view`, `export`, `serve-reward`, `serve-training`,
`version`.

Errors that rlhfkit raises on purpose print as one line (`error: ...`) with exit code 2;
`--debug` anywhere on the command line shows the traceback instead.
"""

from __future__ import annotations

import os
import sys

USAGE = """usage: rlhfkit COMMAND [flags]      (or: python -m rlhfkit COMMAND [flags])

commands:
  demo        GRPO on SmolLM2-135M-Instruct learns arithmetic in the asked format (~3 min, 2-core CPU with bf16)
  train rl    RL training (PPO, REINFORCE++, GRPO, Dr.GRPO, RLOO, ...): rlhfkit train rl --help
  train sft   supervised fine-tuning (packing, LoRA): rlhfkit train sft --help
  train rm    Bradley-Terry reward model: rlhfkit train rm --help
  train prm   process reward model on step labels: rlhfkit train prm --help
  train dpo   DPO / IPO / cDPO against a frozen reference: rlhfkit train dpo --help
  train kto   KTO on unpaired desirable / undesirable data: rlhfkit train kto --help
  train kd    knowledge distillation from a teacher on SFT data: rlhfkit train kd --help
  train opd   on-policy distillation: the student samples, a teacher scores each token: rlhfkit train opd --help
  train rs    rejection sampling (best-of-N): sample, score, keep the best, SFT on them: rlhfkit train rs --help
  train iterative-dpo  rounds of sampling, best/worst pairs and DPO: rlhfkit train iterative-dpo --help
  generate    n samples per prompt with train rl's model, data and rollout flags -> generations.jsonl
  lora merge  fold a LoRA adapter into its base: rlhfkit lora merge --lora.adapter DIR --ckpt.output_dir OUT
  serve-reward  a reward file over HTTP: rlhfkit serve-reward --reward.remote_url FILE.py --port N
  serve-training  Tinker's training API for the tinker SDK: rlhfkit serve-training --model NAME [--lora.rank R | --full]
  plan        the step counts and a memory estimate of a train rl run (same flags), no model loaded
  eval        pass@k / maj@k of a model on --eval.dataset with a verifier (same flags as train rl)
  view RUN    write RUN/samples.html: the completions of each step, filterable by step and reward
  export CKPT OUT  a checkpoint (single-process, FSDP-sharded or LoRA) as an HF model folder
  version     the versions of rlhfkit, Python, torch and transformers (also --version)

flags are dotted: --section.name VALUE (e.g. --rollout.n_samples_per_prompt 8); --config FILE.yaml
loads defaults that flags override; --debug shows tracebacks. `rlhfkit COMMAND --help` describes
every flag of a command: its meaning, type, default, allowed values and OpenRLHF alias names.
"""

LORA_USAGE = """usage: rlhfkit lora merge --lora.adapter ADAPTER_DIR [--lora.base BASE] --ckpt.output_dir OUT

Folds a LoRA adapter (from `rlhfkit train sft|rm|dpo|kto --ds.lora.rank N`) into its base model
and writes a full HF model folder to OUT. --lora.base defaults to the base recorded in the adapter."""

# Optional packages -> the extra of `pip install 'rlhfkit[EXTRA]'` that brings them.
EXTRAS = {"ray": "ray", "vllm": "vllm", "fastapi": "serve", "uvicorn": "serve", "starlette": "serve",
          "wandb": "wandb", "gguf": "gguf", "trl": "bench", "tinker": "tinker"}


def version_text() -> str:
    """"rlhfkit X (python Y, torch Z, transformers W)", from package metadata (nothing imported)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    import rlhfkit

    parts = [f"python {platform.python_version()}"]
    for dist in ("torch", "transformers"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} not installed")
    return f"rlhfkit {rlhfkit.__version__} ({', '.join(parts)})"


def command_help(argv: list[str]) -> str:
    """The `--help` text of the command in `argv` (argv holds --help / -h somewhere)."""
    import importlib

    from rlhfkit.config import help as flag_help
    from rlhfkit.config.rl import RL_ALIASES, RLConfig

    cmd = argv[0]
    kind = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
    if cmd == "train":
        if kind not in flag_help.COMMANDS:
            return ("usage: rlhfkit train rl|sft|rm|dpo|kto|prm|kd|opd|rs|iterative-dpo [flags]; "
                    "rlhfkit train KIND --help lists the flags")
        return flag_help.command_help(kind)
    if cmd == "demo":
        from rlhfkit.cli.demo import DEMO_FLAGS
        from rlhfkit.config.parse import parse_config

        doc = importlib.import_module("rlhfkit.cli.demo").__doc__
        presets = parse_config(RLConfig, list(DEMO_FLAGS))
        return flag_help.help_text(RLConfig, RL_ALIASES, presets, usage=f"usage: rlhfkit demo [flags]\n\n{doc}",
                                   intro="The demo takes every flag of `rlhfkit train rl`; the defaults below "
                                         "are the demo's presets.")
    if cmd in ("plan", "eval"):
        doc = importlib.import_module(f"rlhfkit.cli.{cmd}_cmd").__doc__
        return flag_help.help_text(RLConfig, RL_ALIASES, usage=f"usage: rlhfkit {cmd} [flags]\n\n{doc}",
                                   intro="The flags of `rlhfkit train rl`:")
    if cmd == "generate":
        return flag_help.command_help("generate", usage="usage: rlhfkit generate [flags]\n")
    if cmd in ("view", "export"):
        return importlib.import_module(f"rlhfkit.cli.{cmd}_cmd").__doc__
    if cmd == "serve-reward":
        from rlhfkit.config.serve import ServeRewardConfig

        return flag_help.help_text(ServeRewardConfig, usage="usage: rlhfkit serve-reward --reward.remote_url "
                                   "FILE.py [--port N] [flags]\n", intro=flag_help.section_doc(ServeRewardConfig))
    if cmd == "serve-training":
        from rlhfkit.config.serve_training import ServeTrainingConfig

        return flag_help.help_text(ServeTrainingConfig, usage="usage: rlhfkit serve-training --model NAME_OR_PATH "
                                   "[--lora.rank R | --full] [flags]\n", intro=flag_help.section_doc(ServeTrainingConfig))
    if cmd == "lora":
        return LORA_USAGE
    return USAGE


def dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("--version", "version"):
        print(version_text())
        return 0
    if "-h" in rest or "--help" in rest:
        print(command_help(argv))
        return 0
    if cmd == "demo":
        from rlhfkit.cli import demo

        return demo.run(rest)
    if cmd == "serve-reward":
        from rlhfkit.cli import serve_reward

        return serve_reward.run(rest)
    if cmd == "serve-training":
        from rlhfkit.cli import serve_training

        return serve_training.run(rest)
    if cmd in ("plan", "eval", "view", "export"):
        import importlib

        return importlib.import_module(f"rlhfkit.cli.{cmd}_cmd").run(rest)
    if cmd == "train" and rest and rest[0] == "rl":
        from rlhfkit.cli import train_rl

        return train_rl.run(rest[1:])
    if cmd == "train" and rest and rest[0] == "opd":
        from rlhfkit.cli import train_rl

        return train_rl.run_opd(rest[1:])
    if cmd == "train" and rest and rest[0] in ("sft", "rm", "dpo", "kto", "prm", "kd"):
        from rlhfkit.cli import train_supervised

        return train_supervised.run(rest[0], rest[1:])
    if cmd == "lora":
        from rlhfkit.cli import train_supervised

        return train_supervised.run_lora(rest)
    if cmd == "generate" or (cmd == "train" and rest and rest[0] in ("rs", "iterative-dpo")):
        from rlhfkit.cli import workflows_cmd

        return workflows_cmd.run_generate(rest) if cmd == "generate" else workflows_cmd.run_rounds(rest[0], rest[1:])
    print(f"error: unknown command {' '.join(argv[:2])!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def missing_extra(exc: BaseException) -> str | None:
    """The one-line error for an exception caused by a missing optional package (None otherwise):
    the exception or one in its chain is an ImportError of a package of EXTRAS (or transformers'
    ImportError for GGUF files without the gguf package)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ImportError):
            top = (e.name or "").split(".")[0]
            if top not in EXTRAS and "gguf" in str(e).lower():
                top = "gguf"
            if top in EXTRAS:
                return (f"the optional package {top} is not installed (needed here); install it with: "
                        f"pip install 'rlhfkit[{EXTRAS[top]}]'")
        e = e.__cause__ or e.__context__
    return None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    from rlhfkit.errors import RlhfkitError
    from rlhfkit.tracking.progress import install_console_logging

    install_console_logging()
    try:
        return dispatch(argv)
    except (RlhfkitError, ImportError) as e:
        extra = missing_extra(e)
        if debug or not (isinstance(e, RlhfkitError) or extra):
            raise
        print(f"error: {extra or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `rlhfkit train rl --help | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
