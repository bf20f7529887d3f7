"""Parsing ``controller_quorum_voters``."""

from __future__ import annotations

import pytest

from raft.voters import parse_quorum_voters


def test_voters_parse_ids_hosts_and_ports() -> None:
    assert parse_quorum_voters("1@127.0.0.1:9093, 2@ctrl-2.local:9093,3@[::1]:9094") == {
        1: "127.0.0.1:9093",
        2: "ctrl-2.local:9093",
        3: "[::1]:9094",
    }


@pytest.mark.parametrize(
    "text", ["", "1@host", "x@host:1", "1@host:0", "1@host:70000", "1@a:1,1@b:2", "1@h o:1"]
)
def test_bad_voter_lists_are_refused_with_the_entry_named(text: str) -> None:
    with pytest.raises(ValueError, match="controller_quorum_voters"):
        parse_quorum_voters(text)
