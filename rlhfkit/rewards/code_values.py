"""The values of the code verifier's call protocol (`rlhfkit.rewards.code`): one JSON form for both
sides of the process boundary. The trainer encodes the arguments of a call and decodes the child's
reply; the child decodes the arguments and encodes the returned value. The child's script is built
from this module's source (`CHILD_SOURCE`), so the two sides cannot drift apart.

Plain values are None, bool, int, float, str (as themselves), list, and, tagged, tuple, dict, set /
frozenset and bytes; any other object is a handle `{"ref": N}` that the side holding it resolves.
The functions use builtins only and carry no annotations: the sandboxed child runs them as written
here.
"""

from __future__ import annotations

import inspect


def encode_value(x, other):
    """`x` as JSON-ready plain values; `other(obj) -> dict` gives the form of an object of any other
    type (a handle, or an error)."""
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [encode_value(v, other) for v in x]
    if t is tuple:
        return {"tuple": [encode_value(v, other) for v in x]}
    if t is dict:
        return {"dict": [[encode_value(k, other), encode_value(v, other)] for k, v in x.items()]}
    if t is set or t is frozenset:
        return {"set": [encode_value(v, other) for v in x]}
    if t is bytes:
        return {"bytes": x.hex()}
    return other(x)


def decode_value(x, ref, depth=0):
    """The value `encode_value` wrote, checked type by type; `ref(n: int)` resolves a handle.
    Anything else (or nesting deeper than 200) is a ValueError."""
    if depth > 200:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is list:
        return [decode_value(v, ref, depth + 1) for v in x]
    if t is dict and len(x) == 1:
        (k, v), = x.items()
        if k == "ref" and type(v) is int:
            return ref(v)
        if k == "bytes" and type(v) is str:
            return bytes.fromhex(v)
        if type(v) is list:
            if k == "tuple":
                return tuple(decode_value(i, ref, depth + 1) for i in v)
            if k == "set":
                return {decode_value(i, ref, depth + 1) for i in v}
            if k == "dict" and all(type(p) is list and len(p) == 2 for p in v):
                return {decode_value(a, ref, depth + 1): decode_value(b, ref, depth + 1) for a, b in v}
    raise ValueError(f"malformed value: {str(x)[:80]}")


# The two functions as the child defines them.
CHILD_SOURCE = inspect.getsource(encode_value) + "\n\n" + inspect.getsource(decode_value)
