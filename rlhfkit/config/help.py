"""`--help` of the config-driven commands, read from the configs themselves.

Each flag's description is the string literal under its dataclass field (an attribute docstring:
Python keeps none at run time, so they are read from the source with `ast`); its type and
default come from the dataclass; its allowed values from `CHOICES` (the tuples `validate`
checks against); its aliases from the command's alias table (OpenRLHF's names). Flags are grouped
by config section. `markdown(...)` renders the same table for docs/cli/; regenerate those blocks
with `python -m rlhfkit.config.help --write-docs docs`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import sys
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from rlhfkit.config import generate, kd, opd, preference, prm, rl, sft
from rlhfkit.config.openrlhf import CONDITIONAL_SFT_ALIASES
from rlhfkit.config.rl_checks import TRUNCATIONS

WIDTH = 100
INDENT = "      "

# (dataclass, field) -> the values `validate` accepts. A subclass inherits its bases' entries.
CHOICES: dict[tuple[type, str], tuple[str, ...]] = {
    (rl.ActorConfig, "dtype"): rl.DTYPES,
    (rl.ActorConfig, "autocast"): rl.AUTOCASTS,
    (rl.ActorConfig, "lr_scheduler"): rl.LR_SCHEDULERS,
    (rl.ActorConfig, "policy_loss_type"): rl.POLICY_LOSS_TYPES,
    (rl.ActorConfig, "loss_agg_mode"): rl.LOSS_AGG_MODES,
    (rl.AdvantageConfig, "estimator"): rl.ADVANTAGE_ESTIMATORS,
    (rl.AdvantageConfig, "whiten"): rl.WHITEN_MODES,
    (rl.AdvantageConfig, "is_correction_type"): rl.IS_CORRECTION_TYPES,
    (rl.KLConfig, "estimator"): rl.KL_ESTIMATORS,
    (rl.AlgoConfig, "teacher_kl_estimator"): rl.KL_ESTIMATORS,
    (rl.RolloutConfig, "engine"): rl.ENGINES,
    (rl.DataConfig, "truncation"): TRUNCATIONS,
    (rl.DistributedConfig, "backend"): rl.BACKENDS,
    (rl.WandbConfig, "mode"): rl.WANDB_MODES,
    (rl.BaseLoggerConfig, "log_level"): rl.LOG_LEVELS,
    (sft.ModelConfig, "dtype"): rl.DTYPES,
    (sft.ModelConfig, "autocast"): rl.DTYPES,
    (sft.SFTModelConfig, "loss_type"): sft.SFT_LOSS_TYPES,
    (sft.SFTDataConfig, "truncation"): sft.SFT_TRUNCATIONS,
    (sft.SupervisedTrainConfig, "lr_scheduler"): rl.LR_SCHEDULERS,
    (generate.IterativeSettings, "ref"): generate.REF_MODES,
}

# command -> (config class, alias table)
COMMANDS: dict[str, tuple[type, dict[str, str]]] = {
    "rl": (rl.RLConfig, rl.RL_ALIASES),
    "sft": (sft.SFTConfig, {**sft.SUPERVISED_ALIASES, **CONDITIONAL_SFT_ALIASES}),
    "rm": (preference.RMConfig, sft.SUPERVISED_ALIASES),
    "dpo": (preference.DPOConfig, sft.SUPERVISED_ALIASES),
    "kto": (preference.KTOConfig, sft.SUPERVISED_ALIASES),
    "prm": (prm.PRMConfig, prm.PRM_ALIASES),
    "generate": (generate.GenerateConfig, generate.WORKFLOW_ALIASES),
    "rs": (generate.RSConfig, generate.WORKFLOW_ALIASES),
    "iterative-dpo": (generate.IterativeDPOConfig, generate.WORKFLOW_ALIASES),
    "kd": (kd.KDConfig, sft.SUPERVISED_ALIASES),
    "opd": (opd.OPDConfig, opd.OPD_ALIASES),
}


@dataclasses.dataclass(frozen=True)
class Flag:
    """One leaf field of a config: `--name`, as `--help` and the docs show it."""

    name: str
    """Dotted flag name, e.g. actor.adam.lr."""
    section: str
    """The dotted path of the section that holds it, e.g. actor.adam."""
    type: Any
    """The annotated type."""
    default: Any
    """The value when the flag is not given."""
    doc: str
    """The field's docstring as one paragraph ("" when it has none)."""
    choices: tuple[str, ...]
    """The allowed values (empty: any value of the type)."""
    aliases: tuple[str, ...]
    """Other names accepted for this flag (OpenRLHF's)."""


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring (one paragraph) for dataclass `cls` and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):  # no source (e.g. bytecode only): no descriptions
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return docs


def section_doc(cls: type) -> str:
    """The first paragraph of a section class's own docstring ("" when it has none)."""
    doc = cls.__dict__.get("__doc__") or ""
    if not doc or doc.startswith(cls.__name__ + "("):  # the signature dataclasses writes
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def choices_of(cls: type, name: str) -> tuple[str, ...]:
    for klass in cls.__mro__:
        if (klass, name) in CHOICES:
            return CHOICES[(klass, name)]
    return ()


def flags(cls: type, aliases: dict[str, Any] | None = None, defaults: Any = None) -> list[Flag]:
    """Every leaf flag of config class `cls` in declaration order. `defaults`: an instance whose
    values are shown as the defaults (e.g. the demo's presets); default `cls()`."""
    by_target: dict[str, list[str]] = {}
    for alias, target in (aliases or {}).items():
        if not isinstance(target, str):  # an OpenRLHF rule: listed under the flag it maps to one for one
            if getattr(target, "kind", None) != "mapped" or target.convert is not None or not target.to:
                continue
            target = target.to
        if alias != target:
            by_target.setdefault(target, []).append(alias)
    out: list[Flag] = []

    def walk(klass: type, value: Any, prefix: str) -> None:
        hints = typing.get_type_hints(klass)
        docs = field_docs(klass)
        for f in dataclasses.fields(klass):
            tp, name, v = hints[f.name], prefix + f.name, getattr(value, f.name)
            if dataclasses.is_dataclass(tp):
                walk(tp, v, name + ".")
            else:
                out.append(Flag(name, prefix[:-1], tp, v, docs.get(f.name, ""), choices_of(klass, f.name),
                                tuple(by_target.get(name, ()))))

    walk(cls, cls() if defaults is None else defaults, "")
    return out


def grouped(items: list[Flag], cls: type) -> list[Flag]:
    """`items` with each section's flags together, sections in the order of `sections(cls)` (a
    section's own flags before those of its subsections)."""
    order = {name: i for i, name in enumerate(["", *sections(cls)])}
    return sorted(items, key=lambda f: order[f.section])


def sections(cls: type, prefix: str = "") -> dict[str, str]:
    """Dotted section path -> the description of its class (docstring), every nested section."""
    out: dict[str, str] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out[prefix + f.name] = section_doc(tp)
            out.update(sections(tp, prefix + f.name + "."))
    return out


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def type_text(tp: Any) -> str:
    """How a value of type `tp` is written on the command line: INT, FLOAT FLOAT, INT,... or none."""
    base, optional = _strip_optional(tp)
    if typing.get_origin(base) is tuple:
        args = typing.get_args(base)
        text = f"{type_text(args[0])},..." if len(args) == 2 and args[1] is Ellipsis else " ".join(
            type_text(a) for a in args)
    else:
        text = {bool: "BOOL", int: "INT", float: "FLOAT", str: "STR"}.get(base, getattr(base, "__name__", str(base)))
    return text + ("|none" if optional else "")


def value_text(value: Any, tp: Any = None) -> str:
    """A value as it would be typed on the command line (none, true, 0.2 0.2, 1,4,8)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        base, _ = _strip_optional(tp) if tp is not None else (None, False)
        variable = base is not None and typing.get_args(base)[-1:] == (Ellipsis,)
        if not value:
            return '""'
        return ("," if variable else " ").join(value_text(v) for v in value)
    return str(value)


def _wrap(text: str, indent: str = INDENT) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False)


def help_text(cls: type, aliases: dict[str, Any] | None = None, defaults: Any = None, usage: str = "",
              intro: str = "") -> str:
    """The `--help` of a command whose flags are config class `cls`: sections, then for each flag
    `--name TYPE (default: X)`, its description, its choices and its aliases."""
    lines = [usage] if usage else []
    lines += _wrap(
        "Flags are dotted: --section.name VALUE or --section.name=VALUE. A bare boolean flag means true; "
        "none clears an optional value; --config FILE.yaml loads values that flags override; --debug shows "
        "tracebacks instead of one-line errors.", "")
    if intro:
        lines += ["", *_wrap(intro, "")]
    section_docs = sections(cls)
    current = None
    for f in grouped(flags(cls, aliases, defaults), cls):
        if f.section != current:
            current = f.section
            about = section_docs.get(current, "")
            lines += ["", f"{current or 'general'}:" + (f" {about}" if about else "")]
        lines.append(f"  --{f.name} {type_text(f.type)} (default: {value_text(f.default, f.type)})")
        if f.doc:
            lines += _wrap(f.doc)
        if f.choices:
            lines += _wrap("choices: " + choices_text(f))
        if f.aliases:
            lines += _wrap("aliases: " + ", ".join("--" + a for a in f.aliases))
    return "\n".join(lines)


def command_help(command: str, defaults: Any = None, title: str = "", usage: str = "") -> str:
    """`rlhfkit train COMMAND --help` for COMMAND in COMMANDS (`usage`: another first line)."""
    cls, aliases = COMMANDS[command]
    usage = usage or f"usage: rlhfkit train {command} [--config FILE.yaml] [--section.name VALUE ...] [--debug]\n"
    return help_text(cls, aliases, defaults, usage=usage, intro=title or section_doc(cls))


def _md(text: str) -> str:
    """`text` for a Markdown table cell: pipes escaped, and < outside `code` spans (else it would
    read as an HTML tag: <output_dir>)."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def choices_text(f: Flag) -> str:
    """"a, b, c" (", none" added when the flag is optional)."""
    return ", ".join(f.choices) + (", none" if f.choices and _strip_optional(f.type)[1] else "")


def markdown(cls: type, only: set[str] | None = None) -> str:
    """The flags of `cls` as Markdown tables, one per section (`only`: these flag names)."""
    section_docs = sections(cls)
    out: list[str] = []
    current = None
    for f in grouped(flags(cls), cls):
        if only is not None and f.name not in only:
            continue
        if f.section != current:
            current = f.section
            about = section_docs.get(current, "")
            out += ["", f"#### `{current}`" + (f": {about}" if about else ""), "",
                    "| flag | value | default | meaning |", "|---|---|---|---|"]
        meaning = f.doc
        if f.choices:
            meaning += " One of: " + ", ".join(f"`{c}`" for c in choices_text(f).split(", ")) + "."
        default = value_text(f.default, f.type).replace("|", "\\|")
        out.append(f"| `--{f.name}` | {_md(type_text(f.type))} | `{default}` | {_md(meaning)} |")
    return "\n".join(out).strip() + "\n"


# ------------------------------------------------------------------ generated blocks of docs/cli
# train opd's page shows the teacher's flags and those whose defaults differ from train rl's.
OPD_SHOWN = {"rollout.batch_size", "rollout.n_samples_per_prompt", "algo.advantage.estimator",
             "algo.advantage.gamma", "algo.advantage.whiten", "train.batch_size", "ckpt.output_dir"}
BEGIN = "<!-- flags:{name} begin: generated by `python -m rlhfkit.config.help --write-docs docs` -->"
END = "<!-- flags:{name} end -->"


def doc_blocks() -> dict[str, tuple[str, str]]:
    """Block name -> (file under docs/, generated Markdown)."""
    sft_flags = {f.name for f in flags(sft.SFTConfig)}
    dpo_only = {f.name for f in flags(preference.DPOConfig)} - sft_flags
    rm_only = {f.name for f in flags(preference.RMConfig)} - sft_flags
    rl_flags = {f.name for f in flags(rl.RLConfig)}
    return {
        "train_rl": ("cli/train_rl.md", markdown(rl.RLConfig)),
        "train_rs": ("cli/train_rs.md", markdown(generate.RSConfig, only={f.name for f in flags(generate.RSConfig)}
                                                 - rl_flags)),
        "train_iterative_dpo": ("cli/train_iterative_dpo.md", markdown(
            generate.IterativeDPOConfig, only={f.name for f in flags(generate.IterativeDPOConfig)} - rl_flags)),
        "train_sft": ("cli/train_supervised.md", markdown(sft.SFTConfig)),
        "train_rm": ("cli/train_supervised.md", markdown(preference.RMConfig, only=rm_only)),
        "train_dpo": ("cli/train_supervised.md", markdown(preference.DPOConfig, only=dpo_only)),
        "train_prm": ("cli/train_prm.md", markdown(prm.PRMConfig)),
        "train_kd": ("cli/train_kd.md", markdown(kd.KDConfig, only={f.name for f in flags(kd.KDConfig)} - sft_flags)),
        "train_opd": ("cli/train_opd.md", markdown(opd.OPDConfig, only=OPD_SHOWN | {
            f.name for f in flags(opd.OPDConfig) if f.name.startswith("algo.teacher_")})),
    }


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the lines between the BEGIN/END markers of block `name` replaced by `body`."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"no block {name!r} (markers {begin} ... {end})")
    return pattern.sub(lambda _: f"{begin}\n{body}{end}", text)


def write_docs(docs_dir: str | Path) -> list[Path]:
    """Rewrite the generated flag tables of docs/cli/*.md; returns the files that changed."""
    changed = []
    for name, (rel, body) in doc_blocks().items():
        path = Path(docs_dir) / rel
        old = path.read_text(encoding="utf-8")
        new = replace_block(old, name, body)
        if new != old:
            path.write_text(new, encoding="utf-8")
            changed.append(path)
    return changed


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write-docs":
        for p in write_docs(sys.argv[2]):
            print(f"updated {p}")
    elif len(sys.argv) == 2 and sys.argv[1] in COMMANDS:
        print(command_help(sys.argv[1]))
    else:
        sys.exit("usage: python -m rlhfkit.config.help (--write-docs DOCS_DIR | " + " | ".join(COMMANDS) + ")")
