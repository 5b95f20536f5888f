import pytest

from rlhfkit.core.tables import lookup


def test_lookup_returns_the_entry():
    assert lookup({"a": 1, "b": 2}, "b", "letter") == 2


def test_lookup_unknown_name_lists_valid_in_table_order():
    with pytest.raises(ValueError) as err:
        lookup({"zeta": 1, "alpha": 2}, "beta", "letter")
    assert str(err.value) == "unknown letter 'beta'; valid: zeta, alpha"


def test_lookup_unhashable_name_is_the_same_error():
    with pytest.raises(ValueError, match="unknown letter \\['a'\\]; valid: a"):
        lookup({"a": 1}, ["a"], "letter")
