"""The CLI a user expects: `--help` with each flag's description, type, default, allowed values and
aliases; `--version` / `version` / `python -m rlhfkit`; `--logger.log_level`; a missing optional
package named in one line with its `pip install` command."""

import dataclasses
import importlib
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import rlhfkit
from rlhfkit.cli.main import main, missing_extra
from rlhfkit.config import help as flag_help
from rlhfkit.config.parse import field_table
from rlhfkit.config.rl import RL_ALIASES, RLConfig
from rlhfkit.config.serve import ServeRewardConfig
from rlhfkit.errors import ModelError
from rlhfkit.tracking.progress import install_console_logging, set_log_level

ROOT = Path(__file__).resolve().parents[3]


def run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def flag_block(out: str, name: str) -> str:
    """The lines of `--name` in a --help text: its header and its indented lines."""
    lines = out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(f"  --{name} "))
    block = [lines[i]]
    for line in lines[i + 1:]:
        if not line.startswith("      "):
            break
        block.append(line)
    return "\n".join(block)


# ------------------------------------------------------------------ --help
def test_train_rl_help_describes_every_flag_with_type_default_choices_and_aliases(capsys):
    rc, out, err = run(["train", "rl", "--help"], capsys)
    assert rc == 0 and err == ""
    for name in field_table(RLConfig):
        assert f"\n  --{name} " in out, name
    assert flag_block(out, "actor.model_name_or_path") == (
        "  --actor.model_name_or_path STR (default: smollm2)\n"
        "      HF folder, a .gguf file, or `smollm2` (the packaged SmolLM2-135M-Instruct, converted once).\n"
        "      aliases: --pretrain")
    assert flag_block(out, "algo.advantage.estimator").endswith(
        "      choices: gae, reinforce, reinforce_baseline, rloo, group_norm, dr_grpo, group_mean_batch_std\n"
        "      aliases: --advantage_estimator")
    assert "choices: true, mean, false" in flag_block(out, "algo.advantage.whiten")
    assert "choices: k1, k2, k3, k3_stable" in flag_block(out, "algo.kl.estimator")
    assert "choices: float32, bfloat16, float16, auto, none" in flag_block(out, "actor.autocast")
    assert "choices: hf, vllm" in flag_block(out, "rollout.engine")
    assert "choices: local, ray" in flag_block(out, "distributed.backend")
    assert "choices: online, offline, disabled" in flag_block(out, "logger.wandb.mode")
    assert flag_block(out, "logger.log_level").startswith("  --logger.log_level STR (default: info)\n")
    assert "choices: debug, info, warning, error" in flag_block(out, "logger.log_level")
    assert flag_block(out, "actor.eps_clip_low_high").startswith(
        "  --actor.eps_clip_low_high FLOAT FLOAT (default: 0.2 0.2)\n      PPO clip range")
    assert flag_block(out, "eval.k").startswith("  --eval.k INT,... (default: 1)")
    assert flag_block(out, "train.max_steps").startswith("  --train.max_steps INT|none (default: none)")
    # sections are headed by their name and description; a section's flags stay together
    assert "\nalgo.kl: The KL penalty against the reference model.\n  --algo.kl.init_coef " in out
    assert out.index("\nactor.adam:") > out.index("--actor.ema_beta ")


@pytest.mark.parametrize("kind", ["sft", "rm", "dpo", "kto", "prm", "kd"])
def test_supervised_help_lists_their_flags_and_aliases(kind, capsys):
    rc, out, _ = run(["train", kind, "-h"], capsys)
    cls = flag_help.COMMANDS[kind][0]
    assert rc == 0 and out.startswith(f"usage: rlhfkit train {kind} ")
    for name in field_table(cls):
        assert f"\n  --{name} " in out, name
    assert "aliases: --learning_rate" in flag_block(out, "adam.lr")
    assert "choices: constant, linear, cosine, cosine_with_min_lr" in flag_block(out, "train.lr_scheduler")
    assert "choices: debug, info, warning, error" in flag_block(out, "logger.log_level")
    assert ("--model.beta " in out) == (kind in ("dpo", "kto"))
    assert ("aliases: --placeholder_token" in out) == (kind == "prm")
    if kind in ("dpo", "kto"):
        assert flag_block(out, "model.beta") == (
            "  --model.beta FLOAT (default: 0.1)\n"
            "      Temperature of the implicit reward beta * log(pi / ref).\n"
            "      aliases: --beta")


def test_demo_help_shows_the_demo_presets_as_defaults(capsys):
    rc, out, _ = run(["demo", "--help"], capsys)
    assert rc == 0 and out.startswith("usage: rlhfkit demo")
    assert flag_block(out, "rollout.max_new_tokens").startswith("  --rollout.max_new_tokens INT (default: 12)")
    assert flag_block(out, "train.max_steps").startswith("  --train.max_steps INT|none (default: 40)")
    assert flag_block(out, "algo.dynamic_filtering_range").startswith(
        "  --algo.dynamic_filtering_range FLOAT FLOAT (default: 0.0 1.0)")


@pytest.mark.parametrize("cmd, needles", [
    ("plan", ["usage: rlhfkit plan", "--plan.num_prompts N", "\n  --rollout.batch_size INT (default: 16)"]),
    ("eval", ["usage: rlhfkit eval", "pass@k and maj@k", "\n  --eval.verifier STR|none (default: none)"]),
    ("serve-reward", ["usage: rlhfkit serve-reward", "\n  --port INT (default: 5000)\n      TCP port"]),
    ("view", ["rlhfkit view RUN_DIR"]),
    ("lora", ["usage: rlhfkit lora merge --lora.adapter"]),
])
def test_other_commands_have_help(cmd, needles, capsys):
    rc, out, _ = run([cmd, "--help"], capsys)
    assert rc == 0
    for needle in needles:
        assert needle in out, needle


def test_usage_names_version_python_m_and_the_demo_time_of_the_readme(capsys):
    rc, out, _ = run([], capsys)
    assert rc == 0
    assert "python -m rlhfkit" in out and "  version " in out
    assert "(3-8 min, 2-core CPU with bf16)" in out
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "in 133 s (whole demo 2 min" in readme and "Whole demo 7 min" in readme  # the range the usage line gives


# ------------------------------------------------------------------ the help code and the configs
def all_config_classes():
    return [cls for cls, _ in flag_help.COMMANDS.values()] + [ServeRewardConfig]


def test_every_field_and_section_of_every_config_has_a_docstring():
    missing = sorted({f"{cls.__name__}: --{f.name}" for cls in all_config_classes()
                      for f in flag_help.flags(cls) if not f.doc})
    assert not missing, "fields without a docstring: " + ", ".join(missing)
    for cls in all_config_classes():
        assert flag_help.section_doc(cls), cls
        for name, doc in flag_help.sections(cls).items():
            assert doc, f"{cls.__name__}: section {name} has no class docstring"


def test_choices_table_names_real_fields_whose_defaults_it_allows():
    for (cls, name), values in flag_help.CHOICES.items():
        default = {f.name: f for f in dataclasses.fields(cls)}[name].default
        assert default is None or default in values, (cls, name)


@pytest.mark.parametrize("name", [f.name for f in flag_help.flags(RLConfig) if f.choices])
def test_rl_validation_refuses_a_value_outside_the_listed_choices(name, capsys):
    f = next(f for f in flag_help.flags(RLConfig) if f.name == name)
    rc, _, err = run(["plan", f"--{name}", "bogus"], capsys)
    assert rc == 2
    assert err.count("\n") == 1 and f"--{name}" in err and ", ".join(f.choices) in err, err


def test_field_docs_reads_attribute_docstrings_across_inheritance():
    @dataclasses.dataclass
    class Base:
        a: int = 1
        """First line
        second line."""
        b: str = "x"
        c: float = 0.5
        """C."""

    @dataclasses.dataclass
    class Child(Base):
        c: float = 0.25
        """C, overridden."""
        d: bool = False
        """D."""

    assert flag_help.field_docs(Base) == {"a": "First line second line.", "c": "C."}
    assert flag_help.field_docs(Child) == {"a": "First line second line.", "c": "C, overridden.", "d": "D."}


def test_type_and_value_texts():
    assert [flag_help.type_text(t) for t in (bool, int, float | None, tuple[int, ...], tuple[float, float] | None)] \
        == ["BOOL", "INT", "FLOAT|none", "INT,...", "FLOAT FLOAT|none"]
    assert flag_help.value_text((1, 4, 8), tuple[int, ...]) == "1,4,8"
    assert flag_help.value_text((0.2, 0.3), tuple[float, float]) == "0.2 0.3"
    assert flag_help.value_text((), tuple[int, ...]) == '""'
    assert [flag_help.value_text(v) for v in (None, True, False, 1e-6)] == ["none", "true", "false", "1e-06"]


def test_aliases_come_from_the_alias_table():
    by_name = {f.name: f for f in flag_help.flags(RLConfig, RL_ALIASES)}
    for alias, target in RL_ALIASES.items():
        if isinstance(target, str) and target in by_name:
            assert alias in by_name[target].aliases


# ------------------------------------------------------------------ docs/cli lists every flag
def test_docs_cli_flag_tables_are_generated_from_the_configs():
    for name, (rel, body) in flag_help.doc_blocks().items():
        text = (ROOT / "docs" / rel).read_text(encoding="utf-8")
        assert flag_help.replace_block(text, name, body) == text, (
            f"docs/{rel} is stale: run `python -m rlhfkit.config.help --write-docs docs`")
    rl_doc = (ROOT / "docs" / "cli" / "train_rl.md").read_text(encoding="utf-8")
    for name in field_table(RLConfig):
        assert f"`--{name}`" in rl_doc, name


# ------------------------------------------------------------------ version
def test_version_command_and_flag(capsys):
    for argv in (["--version"], ["version"]):
        rc, out, _ = run(argv, capsys)
        assert rc == 0
        assert out.startswith(f"rlhfkit {rlhfkit.__version__} (python ") and "torch " in out


def test_python_dash_m_rlhfkit_version_in_a_subprocess():
    proc = subprocess.run([sys.executable, "-m", "rlhfkit", "--version"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"rlhfkit {rlhfkit.__version__} (python ")


# ------------------------------------------------------------------ --logger.log_level
@pytest.mark.parametrize("argv", [
    ["train", "rl", "--logger.log_level", "verbose"],
    ["train", "sft", "--logger.log_level", "verbose", "--data.dataset", "x.jsonl"],
    ["eval", "--logger.log_level", "verbose"],
])
def test_bad_log_level_is_one_line_error(argv, capsys):
    rc, _, err = run(argv, capsys)
    assert rc == 2
    assert err == "error: --logger.log_level: unknown value 'verbose'; valid: debug, info, warning, error\n"


def test_log_level_filters_the_rlhfkit_logger_on_the_console(capsys):
    logger = logging.getLogger("rlhfkit.some.module")
    install_console_logging()
    install_console_logging()  # once only: no doubled lines
    try:
        set_log_level("info")
        logger.info("a note")
        logger.debug("hidden")
        logger.warning("a problem")
        assert capsys.readouterr().err == "a note\nwarning: a problem\n"
        set_log_level("error")
        logger.warning("hidden too")
        logger.error("broken")
        assert capsys.readouterr().err == "error: broken\n"
        set_log_level("debug")
        logger.debug("detail")
        assert capsys.readouterr().err == "debug: detail\n"
        with pytest.raises(ValueError, match="valid: debug, info, warning, error"):
            set_log_level("loud")
    finally:
        set_log_level("info")


# ------------------------------------------------------------------ optional packages
def test_missing_extra_is_named_with_its_pip_install(monkeypatch, capsys):
    for name in ("rlhfkit.cli.serve_reward", "rlhfkit.rewards.server"):
        monkeypatch.delitem(sys.modules, name, raising=False)
        # `from rlhfkit.cli import serve_reward` returns the package attribute when an earlier test imported it
        package, _, attr = name.rpartition(".")
        monkeypatch.delattr(importlib.import_module(package), attr, raising=False)
    monkeypatch.setitem(sys.modules, "fastapi", None)  # `import fastapi` now raises ModuleNotFoundError
    rc, _, err = run(["serve-reward", "--reward.remote_url", "builtin:math"], capsys)
    assert rc == 2
    assert err == ("error: the optional package fastapi is not installed (needed here); install it with: "
                   "pip install 'rlhfkit[serve]'\n")


def test_missing_extra_follows_the_exception_chain():
    try:
        try:
            raise ImportError("Loading a GGUF checkpoint in PyTorch, requires both PyTorch and GGUF>=0.10.0")
        except ImportError as exc:
            raise ModelError("cannot load a causal LM from x.gguf: ...") from exc
    except ModelError as e:
        assert missing_extra(e).endswith("pip install 'rlhfkit[gguf]'")
    assert missing_extra(ModuleNotFoundError("No module named 'ray'", name="ray")).endswith("'rlhfkit[ray]'")
    assert missing_extra(ModuleNotFoundError("No module named 'numpy'", name="numpy")) is None
    assert missing_extra(ModelError("no such folder")) is None


def test_core_library_imports_without_the_extras():
    """`import rlhfkit.api` (and the CLI modules) must not need ray, vllm, fastapi, uvicorn, wandb,
    gguf or trl: a fresh interpreter with those imports blocked."""
    blocked = ["ray", "vllm", "fastapi", "uvicorn", "starlette", "wandb", "gguf", "trl"]
    code = (f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
            "import rlhfkit.api, rlhfkit.api.rl, rlhfkit.api.supervised, rlhfkit.cli.main, rlhfkit.cli.train_rl\n"
            "import rlhfkit.cli.train_supervised, rlhfkit.cli.demo, rlhfkit.cli.eval_cmd, rlhfkit.cli.plan_cmd\n"
            "from rlhfkit import RLTrainer, SFTTrainer, RLConfig\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr
