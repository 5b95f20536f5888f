"""The `rlhfkit` command: `train rl|sft|rm|dpo|kto`, `lora merge`, `demo`, `plan`, `eval`, `view`,
`serve-reward`.

Errors that rlhfkit raises on purpose print as one line (`error: ...`) with exit code 2;
`--debug` anywhere on the command line shows the traceback instead.
"""

from __future__ import annotations

import sys

USAGE = """usage: rlhfkit COMMAND [flags]

commands:
  demo        GRPO on SmolLM2-135M-Instruct learns arithmetic in the asked format (~10 min on a laptop CPU)
  train rl    RL training (PPO, REINFORCE++, GRPO, Dr.GRPO, RLOO, ...): rlhfkit train rl --help
  train sft   supervised fine-tuning (packing, LoRA): rlhfkit train sft --help
  train rm    Bradley-Terry reward model: rlhfkit train rm --help
  train dpo   DPO / IPO / cDPO against a frozen reference: rlhfkit train dpo --help
  train kto   KTO on unpaired desirable / undesirable data: rlhfkit train kto --help
  lora merge  fold a LoRA adapter into its base: rlhfkit lora merge --lora.adapter DIR --ckpt.output_dir OUT
  serve-reward  a reward file over HTTP: rlhfkit serve-reward --reward.remote_url FILE.py --port N
  plan        the step counts and a memory estimate of a train rl run (same flags), no model loaded
  eval        pass@k / maj@k of a model on --eval.dataset with a verifier (same flags as train rl)
  view RUN    write RUN/samples.html: the completions of each step, filterable by step and reward

flags are dotted: --section.name VALUE (e.g. --rollout.n_samples_per_prompt 8); --config FILE.yaml
loads defaults that flags override; --debug shows tracebacks.
"""


def _flag_help(argv: list[str]) -> str:
    import dataclasses  # noqa: PLC0415

    from rlhfkit.config import RLConfig  # noqa: PLC0415
    from rlhfkit.config.parse import field_table  # noqa: PLC0415
    from rlhfkit.config.preference import DPOConfig, RMConfig  # noqa: PLC0415
    from rlhfkit.config.sft import SFTConfig  # noqa: PLC0415

    kind = argv[1] if argv[0] == "train" and len(argv) > 1 else "rl"
    cls = {"sft": SFTConfig, "rm": RMConfig, "dpo": DPOConfig, "kto": DPOConfig}.get(kind, RLConfig)
    title = "`rlhfkit demo`, which presets some" if cls is RLConfig else "OpenRLHF's flat names are aliases"
    lines = [f"flags of `rlhfkit train {kind if cls is not RLConfig else 'rl'}` ({title}):"]
    defaults = dataclasses.asdict(cls())
    for name, tp in field_table(cls).items():
        value = defaults
        for part in name.split("."):
            value = value[part]
        lines.append(f"  --{name:<40} default: {value}")
    return "\n".join(lines)


def dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    cmd, rest = argv[0], argv[1:]
    if "-h" in rest or "--help" in rest:
        if cmd in ("plan", "eval", "view"):
            import importlib  # noqa: PLC0415

            print(importlib.import_module(f"rlhfkit.cli.{cmd}_cmd").__doc__)
        print(_flag_help(argv) if cmd != "view" else "")
        return 0
    if cmd == "demo":
        from rlhfkit.cli import demo  # noqa: PLC0415

        return demo.run(rest)
    if cmd == "serve-reward":
        from rlhfkit.cli import serve_reward  # noqa: PLC0415

        return serve_reward.run(rest)
    if cmd in ("plan", "eval", "view"):
        import importlib  # noqa: PLC0415

        return importlib.import_module(f"rlhfkit.cli.{cmd}_cmd").run(rest)
    if cmd == "train" and rest and rest[0] == "rl":
        from rlhfkit.cli import train_rl  # noqa: PLC0415

        return train_rl.run(rest[1:])
    if cmd == "train" and rest and rest[0] in ("sft", "rm", "dpo", "kto"):
        from rlhfkit.cli import train_supervised  # noqa: PLC0415

        return train_supervised.run(rest[0], rest[1:])
    if cmd == "lora":
        from rlhfkit.cli import train_supervised  # noqa: PLC0415

        return train_supervised.run_lora(rest)
    print(f"error: unknown command {' '.join(argv[:2])!r}\n\n{USAGE}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    from rlhfkit.errors import RlhfkitError  # noqa: PLC0415

    try:
        return dispatch(argv)
    except RlhfkitError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
