"""Lookup in the variant tables (one dict per kind: estimators, KL estimators, losses, ...).

Every variant in ``rlhfkit.core`` is chosen by name from one explicit dict per kind; an
unknown name is an error that lists the valid ones, in the table's order. ``lookup`` is that
error, written once.
"""

from typing import TypeVar

V = TypeVar("V")


def lookup(table: dict[str, V], name: str, kind: str) -> V:
    """``table[name]``, or a ``ValueError`` naming the kind and listing the valid names.

    Example: ``lookup(KL_ESTIMATORS, "k4", "KL estimator")`` raises
    ``ValueError("unknown KL estimator 'k4'; valid: k1, k2, k3, k3_stable")``.

    Args:
        table: one variant table (name -> function or spec).
        name: the requested variant.
        kind: what the table holds, for the message (e.g. ``"advantage estimator"``).

    Returns:
        The table's entry for ``name``.
    """
    try:
        return table[name]
    except (KeyError, TypeError):  # TypeError: an unhashable name (e.g. a list from YAML)
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(table)}") from None
