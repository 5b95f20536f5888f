"""Prints the switch-off table (test_switch_offs.py) at the end of the run."""

from tests.switchoff.table import STASH


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    text = config.stash.get(STASH, None)
    if text:
        terminalreporter.section("switch-offs: the tests that fail when a feature is switched off")
        terminalreporter.write_line(text)
