"""Every numeric flag has a range, and `validate` refuses a value outside it (NaN, inf, and a value
just past each bound of the field's range) in one line naming the flag."""

import dataclasses
import importlib
import inspect
import math
import pkgutil
import types
import typing

import pytest

import rlhfkit.config
from rlhfkit.config.generate import (
    GENERATE_RANGES,
    ITERATIVE_DPO_RANGES,
    RS_RANGES,
    GenerateConfig,
    IterativeDPOConfig,
    RSConfig,
    validate_generate,
    validate_iterative_dpo,
    validate_rs,
)
from rlhfkit.config.kd import KD_RANGES, KDConfig, validate_kd
from rlhfkit.config.opd import OPDConfig, validate_opd
from rlhfkit.config.parse import field_table, parse_config
from rlhfkit.config.preference import DPO_RANGES, RM_RANGES, DPOConfig, KTOConfig, RMConfig, validate_dpo, validate_rm
from rlhfkit.config.prm import PRMConfig, validate_prm
from rlhfkit.config.ranges import ORDERED, allows, check_value, describe, parse_spec
from rlhfkit.config.rl import RL_RANGES, RLConfig, validate
from rlhfkit.config.serve import SERVE_RANGES, ServeRewardConfig, validate_serve
from rlhfkit.config.serve_model import SERVE_MODEL_RANGES, ServeModelConfig, validate_serve_model
from rlhfkit.config.serve_training import SERVE_TRAINING_RANGES, ServeTrainingConfig, validate_serve_training
from rlhfkit.config.sft import SUPERVISED_RANGES, SFTConfig, validate_sft
from rlhfkit.errors import ConfigError

# Each command's config, its range table and its validation (serve-reward needs a reward to validate).
ROOTS = {
    RLConfig: (RL_RANGES, validate, []),
    SFTConfig: (SUPERVISED_RANGES, validate_sft, []),
    RMConfig: (RM_RANGES, validate_rm, []),
    DPOConfig: (DPO_RANGES, validate_dpo, []),
    KTOConfig: (DPO_RANGES, lambda c: validate_dpo(c, "kto"), []),
    PRMConfig: (SUPERVISED_RANGES, validate_prm, []),
    ServeRewardConfig: (SERVE_RANGES, validate_serve, ["--reward.remote_url", "r.py"]),
    GenerateConfig: (GENERATE_RANGES, validate_generate, []),
    RSConfig: (RS_RANGES, validate_rs, []),
    IterativeDPOConfig: (ITERATIVE_DPO_RANGES, validate_iterative_dpo, []),
    KDConfig: (KD_RANGES, validate_kd, ["--teacher.model_name_or_path", "t"]),
    OPDConfig: (RL_RANGES, validate_opd, ["--algo.teacher_model_name_or_path", "t"]),
    ServeTrainingConfig: (SERVE_TRAINING_RANGES, validate_serve_training, []),
    ServeModelConfig: (SERVE_MODEL_RANGES, validate_serve_model, ["--model", "m"]),
}
# dataclasses of config/ that are not settings (results, alias rules, help rows)
OUTPUTS = {"BatchPlan", "RunPlan", "Alias", "Flag", "Rule"}


def _number_type(tp):
    """int or float for a numeric field (optional or not, or a tuple of numbers), else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else None
    if typing.get_origin(tp) is tuple:
        kinds = {a for a in typing.get_args(tp) if a is not Ellipsis}
        tp = kinds.pop() if len(kinds) == 1 else None
    return tp if tp in (int, float) else None


def numeric_fields(cls) -> dict[str, object]:
    return {name: tp for name, tp in field_table(cls).items() if _number_type(tp)}


# ------------------------------------------------------------------ the spec language, by hand
@pytest.mark.parametrize("spec,inside,outside", [
    (">= 0", [0, 0.5, 7], [-1e-9, -3]),
    ("> 0", [1e-12, 2], [0, -1]),
    ("<= 1", [1, -5], [1.0001]),
    ("[0, 1)", [0, 0.999], [1, -0.1]),
    ("(0, 1]", [1, 0.5], [0, 1.5]),
    ("[0, 0.5)", [0, 0.25], [0.5]),
    ("-1 or >= 1", [-1, 1, 9], [0, -2, 0.5]),
    ("[1, 65535]", [1, 65535], [0, 65536]),
])
def test_spec_bounds(spec, inside, outside):
    assert all(allows(spec, v) for v in inside)
    assert not any(allows(spec, v) for v in outside)
    assert not any(allows(spec, v) for v in (math.nan, math.inf, -math.inf))


def test_spec_messages():
    assert describe("[0, 1)") == "in [0, 1)" and describe("-1 or >= 1") == "-1 or >= 1"
    with pytest.raises(ConfigError, match=r"^--a.b must be in \[0, 1\) or none \(got 2\)$"):
        check_value("a.b", 2, "[0, 1)", optional=True)
    with pytest.raises(ConfigError, match=r"^--a.b must be a finite number > 0 \(got nan\)$"):
        check_value("a.b", math.nan, "> 0")
    with pytest.raises(ConfigError, match=r"^--a.b: each value must be in \[0, 1\) \(got 0.9 1.0\)$"):
        check_value("a.b", (0.9, 1.0), "[0, 1)")
    with pytest.raises(ConfigError, match=r"^--a.b: value 2 must be >= 0 \(got 0.2 -1\)$"):
        check_value("a.b", (0.2, -1), ("[0, 1)", ">= 0"))
    with pytest.raises(ConfigError, match="LOW < HIGH"):
        check_value("a.b", (1.0, 1.0), ORDERED)
    check_value("a.b", None, "> 0")  # none passes; the type decides whether none is allowed
    with pytest.raises(ValueError, match="bad range spec"):
        parse_spec("positive")


# ------------------------------------------------------------------ every numeric field has a range
def test_every_config_dataclass_is_a_command_config_or_inside_one():
    reachable = set()

    def walk(cls):
        reachable.update(c.__name__ for c in cls.__mro__ if dataclasses.is_dataclass(c))  # a base's fields are its
        for f in dataclasses.fields(cls):
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp)

    for root in ROOTS:
        walk(root)
    defined = set()
    for mod in pkgutil.iter_modules(rlhfkit.config.__path__):
        module = importlib.import_module(f"rlhfkit.config.{mod.name}")
        defined |= {n for n, c in inspect.getmembers(module, dataclasses.is_dataclass)
                    if inspect.isclass(c) and c.__module__ == module.__name__}
    assert defined - reachable - OUTPUTS == set(), "a new config class: add its command to ROOTS"


@pytest.mark.parametrize("cls", list(ROOTS), ids=lambda c: c.__name__)
def test_every_numeric_field_has_a_range_and_every_range_a_field(cls):
    table = ROOTS[cls][0]
    fields = numeric_fields(cls)
    assert sorted(set(fields) - set(table)) == [], "numeric fields without a range in the table"
    assert sorted(set(table) - set(fields)) == [], "ranges of fields that do not exist"
    for name, spec in table.items():  # no spec lets every number through
        for s in spec if isinstance(spec, tuple) else (spec,):
            assert s == ORDERED or any(math.isfinite(t.low) or math.isfinite(t.high) for t in parse_spec(s)), name


def _absurd(spec: str) -> list[float]:
    """NaN, +-inf, and a value just past each finite bound of `spec` that no alternative allows."""
    values = [math.nan, math.inf, -math.inf]
    for t in parse_spec(spec):
        for bound, step in ((t.low, -1), (t.high, 1)):
            if math.isfinite(bound):
                values += [bound + step * 0.5, bound + step]
    return [v for v in values if not allows(spec, v)]


def _cases(cls):
    """(flag, value as the command line gives it) for every refused value of every numeric field."""
    defaults = dataclasses.asdict(cls())
    for name, spec in ROOTS[cls][0].items():
        default = defaults
        for part in name.split("."):
            default = default[part]
        tp = field_table(cls)[name]
        is_int = _number_type(tp) is int
        if spec == ORDERED:
            yield name, "1,0"
            yield name, "0,nan"
            continue
        if isinstance(default, tuple) or "tuple" in str(tp):  # (also an optional tuple whose default is none)
            n = len(default) if default else 1
            specs = spec if isinstance(spec, tuple) else (spec,) * n
            base = list(default) if default else [1]
            for i, s in enumerate(specs):
                for v in _absurd(s):
                    if is_int and not float(v).is_integer():
                        continue
                    row = base.copy()
                    row[i] = int(v) if is_int else v
                    yield name, ",".join(map(str, row))
            continue
        for v in _absurd(spec):
            if is_int and not (math.isfinite(v) and float(v).is_integer()):
                continue
            yield name, str(int(v) if is_int else v)


CASES = list(dict.fromkeys((cls, name, value) for cls in ROOTS for name, value in _cases(cls)))


@pytest.mark.parametrize("cls,name,value", CASES, ids=[f"{c.__name__}-{n}={v}" for c, n, v in CASES])
def test_validate_refuses_values_outside_the_range_in_one_line(cls, name, value):
    _, check, extra = ROOTS[cls]
    cfg = parse_config(cls, [*extra, f"--{name}={value}"])
    with pytest.raises(ConfigError) as e:
        check(cfg)
    msg = str(e.value)
    assert msg.startswith(f"--{name}") and "\n" not in msg, msg


def test_every_numeric_field_gets_refused_cases():
    covered = {(c, n) for c, n, _ in CASES}
    assert covered == {(c, n) for c in ROOTS for n in ROOTS[c][0]}


def test_defaults_pass():
    for cls, (_, check, extra) in ROOTS.items():
        check(parse_config(cls, extra))
