"""The API tables of docs/protocol.md and docs/compatibility.md say what ApiVersions
advertises: every served API once, with its key, its served versions and the first flexible
version (the tables had fallen behind the code once)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.protocol import API_SPECS

DOCS = Path(__file__).resolve().parents[2] / "docs"
# a row: name, key, low EN DASH high (and maybe a note), flexible from, notes
DASH = "\u2013"  # the tables write ranges with an en dash
_ROW = re.compile(rf"^\| (\w+) \| (\d+) \| (\d+){DASH}(\d+)[^|]* \| (\d+) \|")


def _table(text: str) -> dict[int, tuple[str, int, int, int]]:
    rows: dict[int, tuple[str, int, int, int]] = {}
    for line in text.splitlines():
        match = _ROW.match(line)
        if match is None:
            continue
        name, key, low, high, flexible = match.groups()
        assert int(key) not in rows, f"API key {key} listed twice"
        rows[int(key)] = (name, int(low), int(high), int(flexible))
    return rows


@pytest.mark.parametrize("doc", ["protocol.md", "compatibility.md"])
def test_the_api_table_is_what_is_served(doc: str) -> None:
    served = {
        k: (s.name, s.min_version, s.max_version, s.flexible_from) for k, s in API_SPECS.items()
    }
    assert _table((DOCS / doc).read_text()) == served


def test_a_row_with_other_versions_is_seen() -> None:
    """The check reads the table: a wrong range in it is a difference, not a skipped row."""
    wrong = (
        f"| Fetch | 1 | 4{DASH}12 | 12 | notes |\n"
        f"| Produce | 0 | 3{DASH}10 (0{DASH}10 advertised) | 9 | x |"
    )
    assert _table(wrong) == {1: ("Fetch", 4, 12, 12), 0: ("Produce", 3, 10, 9)}
