"""A pytest plugin that switches one feature off for the whole session: `-p tests.switchoff.plugin
--switch-off NAME` replaces the entry point the table (tests/switchoff/table.py) names for NAME
before any test module is imported, and `--switch-off-report PATH` writes each test's outcome
(passed / failed / skipped) as JSON. Without --switch-off it only reports: the unpatched control run."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def pytest_addoption(parser):
    group = parser.getgroup("switch-off")
    group.addoption("--switch-off", default=None, help="name of the switch-off to apply (tests/switchoff/table.py)")
    group.addoption("--switch-off-report", default=None, help="write each test's outcome here (JSON)")


def apply(target: str, make) -> None:
    """Replace `target` ("package.module:Attr" or "package.module:Class.attr") by `make(original)`, also
    where a loaded module holds the same object under its own name (`from module import attr`)."""
    module_name, path = target.split(":")
    owner = importlib.import_module(module_name)
    *outer, attr = path.split(".")
    for name in outer:
        owner = getattr(owner, name)
    original = owner.__dict__[attr] if isinstance(owner, type) else getattr(owner, attr)
    replacement = make(original)
    setattr(owner, attr, replacement)
    if outer:
        return
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith(("rlhfkit", "tests")):
            for key, value in list(vars(module).items()):
                if value is original:
                    setattr(module, key, replacement)


class Outcomes:
    """Each test's outcome: failed if any phase failed, else the call's (or the setup's skip)."""

    def __init__(self, path: str | None):
        self.path, self.outcomes = path, {}

    def pytest_runtest_logreport(self, report):
        counts = report.failed or report.when == "call" or (report.when == "setup" and report.skipped)
        if counts and self.outcomes.get(report.nodeid) != "failed":
            self.outcomes[report.nodeid] = report.outcome

    def pytest_unconfigure(self, config):
        if self.path:
            Path(self.path).write_text(json.dumps(self.outcomes, indent=1))


def pytest_configure(config):
    name = config.getoption("--switch-off")
    if name is not None:
        from tests.switchoff.table import BY_NAME

        switch = BY_NAME[name]
        apply(switch.target, switch.make)
    config.pluginmanager.register(Outcomes(config.getoption("--switch-off-report")), "switch-off-outcomes")
