"""Every switch-off in tests/switchoff/table.py makes its tests fail (and they pass as they are):
no feature can be switched off without a test noticing. The table is printed in the terminal
summary and written to the test's folder as switch_offs.md."""

import pytest

from tests.switchoff.harness import check, table
from tests.switchoff.table import REPORT_KEY, SWITCH_OFFS


# slow: some 30 pytest processes, over three minutes on two cores; CI runs it after the default suite
@pytest.mark.slow
def test_no_switch_off_survives(tmp_path, request):
    rows = check(SWITCH_OFFS, tmp_path)
    text = table(rows)
    (tmp_path / "switch_offs.md").write_text(text + "\n")
    request.node.user_properties.append((REPORT_KEY, text))
    survived = [row["name"] for row in rows if row["survived"]]
    assert not survived, f"switch-offs no test noticed: {survived}\n{text}"
