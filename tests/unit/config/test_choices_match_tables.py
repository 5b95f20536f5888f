"""The config's choice tuples name exactly the entries of the core (and data) tables, in the same order.

config/ may not import core or data (docs/architecture.md), so the names are written twice; this test keeps
the two in step. preference.py and sft.py have no choice tuple that mirrors a core table (DPO's
variants are flags: ``ipo_enable``, ``label_smoothing``).
"""

from rlhfkit.config import rl
from rlhfkit.config.rl_checks import TRUNCATIONS
from rlhfkit.core import AGGREGATIONS, ESTIMATORS, IS_KINDS, KL_ESTIMATORS, POLICY_LOSSES, Whiten
from rlhfkit.data import truncate


def test_advantage_estimators_match_the_table():
    assert rl.ADVANTAGE_ESTIMATORS == tuple(ESTIMATORS)


def test_group_estimators_are_the_grouped_specs():
    assert rl.GROUP_ESTIMATORS == tuple(name for name, spec in ESTIMATORS.items() if spec.grouped)


def test_kl_estimators_match_the_table():
    assert rl.KL_ESTIMATORS == tuple(KL_ESTIMATORS)


def test_loss_aggregation_modes_match_the_table():
    assert rl.LOSS_AGG_MODES == tuple(AGGREGATIONS)


def test_policy_loss_types_match_the_table():
    assert rl.POLICY_LOSS_TYPES == tuple(POLICY_LOSSES)


def test_is_correction_types_name_the_is_kinds_with_dashes_or_underscores():
    assert {t.replace("-", "_") for t in rl.IS_CORRECTION_TYPES} == set(IS_KINDS)


def test_whiten_modes_are_the_enum_values():
    assert rl.WHITEN_MODES == tuple(w.value for w in Whiten)


def test_critic_estimators_are_the_specs_that_need_a_critic():
    from rlhfkit.config.rl_checks import CRITIC_ESTIMATORS

    assert CRITIC_ESTIMATORS == tuple(name for name, spec in ESTIMATORS.items() if spec.needs_critic)


def test_prompt_truncations_match_the_data_table():
    assert TRUNCATIONS == ("skip", "error", *truncate.TRUNCATION_SIDES)  # skip / error cut nothing

