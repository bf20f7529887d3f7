"""The committed generated code under proto/ is what its .proto files generate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_generated_code_matches_its_proto_sources() -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "proto.generate", "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr


def test_every_proto_file_is_generated_and_checked() -> None:
    from proto.generate import PROTO_DIR, SOURCES

    assert sorted(SOURCES) == sorted(p.name for p in PROTO_DIR.glob("*.proto"))
