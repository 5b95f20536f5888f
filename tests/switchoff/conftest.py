"""Prints the switch-off table (test_switch_offs.py) at the end of the run. The test hands the table
over as a user property of its report, which pytest-xdist carries from a worker to the main process."""

from tests.switchoff.table import REPORT_KEY


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    reports = [r for kind in ("passed", "failed") for r in terminalreporter.stats.get(kind, [])]
    texts = [value for r in reports for key, value in getattr(r, "user_properties", ()) if key == REPORT_KEY]
    if texts:
        terminalreporter.section("switch-offs: the tests that fail when a feature is switched off")
        terminalreporter.write_line(texts[-1])
