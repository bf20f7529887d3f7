"""The processes of bench.produce_consume: each role (sink, raw receiver, load generator) runs
as ``python -m MODULE ...`` and talks to the benchmark through its stdout.

How this works. A ``Proc`` starts the role (pinned to a CPU set when asked, through
``taskset``, so every thread it creates stays there), and a thread reads its stdout lines
into a queue; stderr goes to a file kept for the error message. A role prints ``ready ...``
when it can take load and one JSON object as its last line. Every wait is bounded: a role
that does not answer in time is killed and the run fails with its stderr. ``pin_process``
moves an already running process (the runnel broker) with all its threads.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from bench.common import REPO

__all__ = [
    "ALL_CPUS",
    "CLIENT_CPUS",
    "SERVER_CPUS",
    "Proc",
    "RoleError",
    "cpu_seconds",
    "cpu_times",
    "machine_busy_s",
    "pin_process",
]

ALL_CPUS = frozenset(range(os.cpu_count() or 1))
SERVER_CPUS = frozenset({0})
CLIENT_CPUS = frozenset({1})
STOP_TIMEOUT_S = 5.0
STDERR_TAIL_BYTES = 2000


class RoleError(RuntimeError):
    """A role failed, or did not answer in time."""


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, kernel) CPU seconds of a process and its threads, from /proc's utime and stime
    ((0, 0) when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its threads, from /proc (0 when it is gone)."""
    return sum(cpu_times(pid))


def machine_busy_s() -> float:
    """CPU seconds all CPUs have spent busy since boot (not idle, not waiting for I/O, not
    stolen by the hypervisor), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Move every thread of ``pid`` to ``cpus`` (threads it creates later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(task.name), cpus)


class Proc:
    """One role in its own process. Use from one thread."""

    def __init__(self, name: str, module: str, args: list[str], cpus: frozenset[int] | None):
        self.name = name
        command = [sys.executable, "-m", module, *args]
        taskset = shutil.which("taskset")
        if cpus is not None and taskset is not None:
            command = [taskset, "-c", ",".join(map(str, sorted(cpus))), *command]
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop)
        self.popen = subprocess.Popen(
            command,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _read_stdout(self) -> None:
        stdout = self.popen.stdout
        if stdout is not None:
            for line in stdout:
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)  # end of output

    def _line(self, deadline: float) -> str:
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise self._failure("no answer in time") from None
        if line is None:
            raise self._failure("exited early")
        return line

    def ready(self, timeout_s: float) -> str:
        """What follows ``ready`` on the role's first such line (a port, or nothing)."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self._line(deadline)
            if line.startswith("ready"):
                return line[len("ready") :].strip()

    def result(self, timeout_s: float) -> dict[str, Any]:
        """The role's JSON line, once it has exited with status 0."""
        deadline = time.monotonic() + timeout_s
        last = ""
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise self._failure("did not finish in time") from None
            if line is None:
                break
            last = line
        try:
            code = self.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise self._failure("did not exit in time") from None
        if code != 0:
            raise self._failure(f"exited with status {code}")
        parsed: dict[str, Any] = json.loads(last)
        return parsed

    def stop(self) -> None:
        """SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``; reaped."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=STOP_TIMEOUT_S)
        self.stderr.close()

    def _failure(self, what: str) -> RoleError:
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - STDERR_TAIL_BYTES))
        tail = self.stderr.read().decode(errors="replace")
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()
        return RoleError(f"{self.name} {what}; stderr:\n{tail}")
