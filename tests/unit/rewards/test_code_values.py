"""The code verifier's value form, one for both sides of the process boundary (rewards/code_values.py)."""

import json

import pytest

from rlhfkit.rewards import code
from rlhfkit.rewards.code_values import CHILD_SOURCE, decode_value, encode_value


def refuse(x):
    raise TypeError(type(x).__name__)


def test_encode_by_hand():
    value = [1, 2.5, "a", None, True, (1, [2]), {"k": {3}}, b"\x01\xff"]
    assert encode_value(value, refuse) == [1, 2.5, "a", None, True, {"tuple": [1, [2]]},
                                           {"dict": [["k", {"set": [3]}]]}, {"bytes": "01ff"}]
    assert encode_value(frozenset([4]), refuse) == {"set": [4]}
    assert encode_value(object(), lambda x: {"ref": 7}) == {"ref": 7}
    with pytest.raises(TypeError, match="object"):
        encode_value([object()], refuse)


def test_decode_inverts_encode_through_json_and_resolves_handles():
    value = [1, (2, "b"), {"x": (None, False)}, {5, 6}, b"hi", -0.5]
    assert decode_value(json.loads(json.dumps(encode_value(value, refuse))), refuse) == value
    assert decode_value({"ref": 3}, lambda n: ("handle", n)) == ("handle", 3)


@pytest.mark.parametrize("bad", [{"tuple": 1}, {"a": 1, "b": 2}, {"dict": [[1]]}, {"ref": "0"}, {"what": []}])
def test_decode_refuses_what_encode_never_writes(bad):
    with pytest.raises(ValueError):
        decode_value(bad, refuse)


def test_decode_refuses_deep_nesting():
    deep = 0
    for _ in range(202):
        deep = [deep]
    with pytest.raises(ValueError, match="nested too deeply"):
        decode_value(deep, refuse)


def test_the_child_runs_the_same_source_with_builtins_only():
    """The child script opens with these functions' source, and that source runs with no imports."""
    assert code._SERVER.startswith(CHILD_SOURCE)
    ns = {"__builtins__": __builtins__}
    exec(compile(CHILD_SOURCE, "child", "exec"), ns)
    kept = []

    def keep(x):
        kept.append(x)
        return {"ref": len(kept) - 1}

    thing = object()
    sent = ns["encode_value"]([(1, thing), {"s": {2}}], keep)
    assert sent == [{"tuple": [1, {"ref": 0}]}, {"dict": [["s", {"set": [2]}]]}] and kept == [thing]
    assert ns["decode_value"](sent, kept.__getitem__) == [(1, thing), {"s": {2}}]
