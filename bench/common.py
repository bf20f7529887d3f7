"""Small pieces every benchmark uses: its temporary working directory, the commit it
measured, and the met/MISSED word of its table."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["REPO", "git_state", "ratio_text", "verdict", "work_dir"]

REPO = Path(__file__).resolve().parent.parent


@contextmanager
def work_dir(parent: Path, prefix: str) -> Iterator[Path]:
    """A fresh directory under ``parent`` (on the disk being measured), removed afterwards."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def git_state(*paths: str) -> tuple[str | None, bool]:
    """The short commit measured (None outside a checkout), and whether ``paths`` (all of
    the tree when none) had uncommitted changes."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)

    head = git("rev-parse", "--short", "HEAD")
    commit = head.stdout.strip() if head.returncode == 0 else None
    status = git("status", "--porcelain", "--", *paths)
    return commit or None, status.returncode == 0 and bool(status.stdout.strip())


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def ratio_text(ratio: float) -> str:
    """A ratio beside its target: three decimals, so one just below the target does not
    print as the target (0.4966 as "0.50", then MISSED)."""
    return f"{ratio:.3f}"
