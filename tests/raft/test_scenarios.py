"""Runs every story in testdata/*.txt (see scenario.py for the format). To refresh the
expected traces after a deliberate change: RUNNEL_REWRITE_SCENARIOS=1 pytest this file,
then read the diff."""

from __future__ import annotations

from pathlib import Path

import pytest
from scenario import check_file

TESTDATA = Path(__file__).resolve().parent / "testdata"
FILES = sorted(TESTDATA.glob("*.txt"))


def test_there_are_scenarios() -> None:
    assert len(FILES) >= 8


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario(path: Path) -> None:
    check_file(path)


STORY = """# A comment survives a rewrite.
cluster voters=1
----
ok

status
----
{status}
"""


def test_a_mismatch_names_the_file_and_line_and_rewrite_fixes_it(tmp_path: Path) -> None:
    path = tmp_path / "story.txt"
    path.write_text(STORY.format(status="1: leader"))
    with pytest.raises(AssertionError) as err:
        check_file(path, rewrite=False)
    assert f"{path}:6: status" in str(err.value)
    assert "-1: leader" in str(err.value) and "+1: unattached epoch=0" in str(err.value)
    with pytest.raises(AssertionError, match=r"rewrote .*: review its diff"):
        check_file(path, rewrite=True)  # rewritten, and still not a pass
    rewritten = path.read_text()
    assert rewritten.startswith("# A comment survives a rewrite.\ncluster voters=1\n----\nok\n\n")
    check_file(path, rewrite=False)  # now it passes
