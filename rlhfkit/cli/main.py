"""The `rlhfkit` command (also `python -m rlhfkit`): every command is one row of COMMANDS, which feeds
the usage text, each command's `--help` and the dispatch.

Errors that rlhfkit raises on purpose print as one line (`error: ...`) with exit code 2;
`--debug` anywhere on the command line shows the traceback instead.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

LORA_USAGE = """usage: rlhfkit lora merge --lora.adapter ADAPTER_DIR [--lora.base BASE] --ckpt.output_dir OUT

Folds a LoRA adapter (from `rlhfkit train sft|rm|dpo|kto --ds.lora.rank N`) into its base model
and writes a full HF model folder to OUT. --lora.base defaults to the base recorded in the adapter."""

# Optional packages -> the extra of `pip install 'rlhfkit[EXTRA]'` that brings them.
EXTRAS = {"ray": "ray", "vllm": "vllm", "fastapi": "serve", "uvicorn": "serve", "starlette": "serve",
          "wandb": "wandb", "gguf": "gguf", "trl": "bench", "tinker": "tinker", "openai": "agents"}


# ------------------------------------------------------------------ each command's --help
def train_help(cmd: Command) -> str:
    """`rlhfkit train KIND --help`: every flag of KIND's config."""
    from rlhfkit.config import help as flag_help

    return flag_help.command_help(cmd.name.split()[1])


def rl_flags_help(cmd: Command) -> str:
    """The module's docstring and the flags of `rlhfkit train rl` (plan, eval)."""
    from rlhfkit.config import help as flag_help
    from rlhfkit.config.rl import RL_ALIASES, RLConfig

    doc = importlib.import_module(cmd.module).__doc__
    return flag_help.help_text(RLConfig, RL_ALIASES, usage=f"usage: rlhfkit {cmd.name} [flags]\n\n{doc}",
                               intro="The flags of `rlhfkit train rl`:")


def demo_help(cmd: Command) -> str:
    """The demo's docstring and `train rl`'s flags with the demo's presets as defaults."""
    from rlhfkit.cli.demo import DEMO_FLAGS
    from rlhfkit.config import help as flag_help
    from rlhfkit.config.parse import parse_config
    from rlhfkit.config.rl import RL_ALIASES, RLConfig

    doc = importlib.import_module(cmd.module).__doc__
    presets = parse_config(RLConfig, list(DEMO_FLAGS))
    return flag_help.help_text(RLConfig, RL_ALIASES, presets, usage=f"usage: rlhfkit demo [flags]\n\n{doc}",
                               intro="The demo takes every flag of `rlhfkit train rl`; the defaults below "
                                     "are the demo's presets.")


def generate_help(cmd: Command) -> str:
    from rlhfkit.config import help as flag_help

    return flag_help.command_help("generate", usage="usage: rlhfkit generate [flags]\n")


def serve_reward_help(cmd: Command) -> str:
    from rlhfkit.config import help as flag_help
    from rlhfkit.config.serve import ServeRewardConfig

    return flag_help.help_text(ServeRewardConfig, aliases=ServeRewardConfig.ALIASES,
                               usage="usage: rlhfkit serve-reward --reward.remote_url FILE.py | "
                               "--reward.model_name_or_path RM_FOLDER [--port N] [flags]\n",
                               intro=flag_help.section_doc(ServeRewardConfig))


def serve_model_help(cmd: Command) -> str:
    from rlhfkit.config import help as flag_help
    from rlhfkit.config.serve_model import ServeModelConfig

    doc = importlib.import_module(cmd.module).__doc__
    return flag_help.help_text(ServeModelConfig, usage=f"usage: rlhfkit serve MODEL [flags]\n\n{doc}")


def serve_training_help(cmd: Command) -> str:
    from rlhfkit.config import help as flag_help
    from rlhfkit.config.serve_training import ServeTrainingConfig

    return flag_help.help_text(ServeTrainingConfig, usage="usage: rlhfkit serve-training --model NAME_OR_PATH "
                               "[--lora.rank R | --full] [flags]\n", intro=flag_help.section_doc(ServeTrainingConfig))


def module_doc(cmd: Command) -> str:
    """The command module's docstring."""
    return importlib.import_module(cmd.module).__doc__ or ""


def lora_help(cmd: Command) -> str:
    return LORA_USAGE


# ------------------------------------------------------------------ the command table
@dataclass(frozen=True)
class Command:
    """One `rlhfkit` command: `rlhfkit NAME [flags]` runs `MODULE.func(*args, flags)`."""

    name: str  # the words after `rlhfkit` ("demo", "train rl")
    module: str  # the module that runs it
    help: str  # its line in `rlhfkit --help`
    flags_help: Callable[[Command], str] | None = None  # `rlhfkit NAME --help` (None: the usage text)
    func: str = "run"  # the module's function, called with `*args` and the flags after NAME
    args: tuple[str, ...] = ()
    shown: str = ""  # the name in the usage text when it is not `name`


def train(kind: str, module: str, help: str, func: str = "run", args: tuple[str, ...] = ()) -> Command:
    """The row of `rlhfkit train KIND` (its --help: the flags of KIND's config)."""
    return Command(f"train {kind}", module, f"{help}: rlhfkit train {kind} --help", train_help, func, args)


SUPERVISED = "rlhfkit.cli.train_supervised"
WORKFLOWS = "rlhfkit.cli.workflows_cmd"
COMMANDS: tuple[Command, ...] = (
    Command("demo", "rlhfkit.cli.demo", "GRPO on SmolLM2-135M-Instruct learns arithmetic in the asked format "
            "(3-8 min, 2-core CPU with bf16)", demo_help),
    train("rl", "rlhfkit.cli.train_rl", "RL training (PPO, REINFORCE++, GRPO, Dr.GRPO, RLOO, ...)"),
    train("sft", SUPERVISED, "supervised fine-tuning (packing, LoRA)", args=("sft",)),
    train("rm", SUPERVISED, "Bradley-Terry reward model", args=("rm",)),
    train("prm", SUPERVISED, "process reward model on step labels", args=("prm",)),
    train("dpo", SUPERVISED, "DPO / IPO / cDPO against a frozen reference", args=("dpo",)),
    train("kto", SUPERVISED, "KTO on unpaired desirable / undesirable data", args=("kto",)),
    train("kd", SUPERVISED, "knowledge distillation from a teacher on SFT data", args=("kd",)),
    train("opd", "rlhfkit.cli.train_rl", "on-policy distillation: the student samples, a teacher scores each token",
          func="run_opd"),
    train("rs", WORKFLOWS, "rejection sampling (best-of-N): sample, score, keep the best, SFT on them",
          func="run_rounds", args=("rs",)),
    train("iterative-dpo", WORKFLOWS, "rounds of sampling, best/worst pairs and DPO", func="run_rounds",
          args=("iterative-dpo",)),
    Command("generate", WORKFLOWS, "n samples per prompt with train rl's model, data and rollout flags "
            "-> generations.jsonl", generate_help, "run_generate"),
    Command("lora", SUPERVISED, "fold a LoRA adapter into its base: rlhfkit lora merge --lora.adapter DIR "
            "--ckpt.output_dir OUT", lora_help, "run_lora", shown="lora merge"),
    Command("serve-reward", "rlhfkit.cli.serve_reward", "a reward file or a reward model over HTTP: rlhfkit "
            "serve-reward --reward.remote_url FILE.py | --reward.model_name_or_path RM_FOLDER --port N",
            serve_reward_help),
    Command("serve-training", "rlhfkit.cli.serve_training", "Tinker's training API for the tinker SDK: "
            "rlhfkit serve-training --model NAME [--lora.rank R | --full]", serve_training_help),
    Command("serve", "rlhfkit.cli.serve_model", "an OpenAI-compatible server of a model for any OpenAI client: "
            "rlhfkit serve MODEL [--port N]", serve_model_help, shown="serve MODEL"),
    Command("plan", "rlhfkit.cli.plan_cmd", "the step counts and a memory estimate of a train rl run (same "
            "flags), no model loaded", rl_flags_help),
    Command("eval", "rlhfkit.cli.eval_cmd", "pass@k / maj@k of a model on --eval.dataset with a verifier (same "
            "flags as train rl)", rl_flags_help),
    Command("view", "rlhfkit.cli.view_cmd", "write RUN/samples.html: the completions of each step, filterable "
            "by step and reward", module_doc, shown="view RUN"),
    Command("export", "rlhfkit.cli.export_cmd", "a checkpoint (single-process, FSDP-sharded or LoRA) as an HF "
            "model folder", module_doc, shown="export CKPT OUT"),
    Command("version", "rlhfkit.cli.main", "the versions of rlhfkit, Python, torch and transformers (also "
            "--version)", func="print_version"),
)

USAGE = f"""usage: rlhfkit COMMAND [flags]      (or: python -m rlhfkit COMMAND [flags])

commands:
{chr(10).join(f"  {c.shown or c.name:<10}  {c.help}" for c in COMMANDS)}

flags are dotted: --section.name VALUE (e.g. --rollout.n_samples_per_prompt 8); --config FILE.yaml
loads defaults that flags override; --debug shows tracebacks. `rlhfkit COMMAND --help` describes
every flag of a command: its meaning, type, default, allowed values and OpenRLHF alias names.
"""


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


def print_version(argv: list[str]) -> int:
    """`rlhfkit version`: the versions, whatever follows."""
    print(version_text())
    return 0


def find_command(argv: list[str]) -> Command | None:
    """The row whose name is the first one or two words of `argv` (None: no such command)."""
    by_name = {c.name: c for c in COMMANDS}
    return by_name.get(" ".join(argv[:2])) or by_name.get(argv[0])


def command_help(argv: list[str]) -> str:
    """The `--help` text of the command in `argv` (argv holds --help / -h somewhere)."""
    cmd = find_command(argv)
    if cmd is not None and cmd.flags_help is not None:
        return cmd.flags_help(cmd)
    if argv[0] == "train":
        kinds = "|".join(c.name.split()[1] for c in COMMANDS if c.name.startswith("train "))
        return f"usage: rlhfkit train {kinds} [flags]; rlhfkit train KIND --help lists the flags"
    return USAGE


def dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd = find_command(["version"] if argv[0] == "--version" else argv)
    # a command without flags (version) runs whatever follows it, --help included
    if ("-h" in argv or "--help" in argv) and (cmd is None or cmd.flags_help is not None):
        print(command_help(argv))
        return 0
    if cmd is None:
        print(f"error: unknown command {' '.join(argv[:2])!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    rest = argv[len(cmd.name.split()):]
    return getattr(importlib.import_module(cmd.module), cmd.func)(*cmd.args, rest)


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
