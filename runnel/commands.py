"""Plumbing shared by the subcommand modules of the ``runnel`` command line.

A subcommand group (``log`` today; ``node``, ``cluster``, ``topics`` later) is a module with a
``register(subparsers)`` function. Each leaf command stores its handler on the parsed
arguments with :func:`set_handler`; :func:`runnel.cli.main` calls it and maps the two error
types below to exit codes, so handlers never call ``sys.exit`` themselves.

Exit codes: 0 success, 1 the command ran and found (or hit) a problem, 2 usage error,
130 interrupted (Ctrl-C, as a shell reports death by SIGINT).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any, TypeAlias

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT

Handler = Callable[[argparse.Namespace], int]
# argparse keeps its subparsers action private; this is the type its add_parser lives on.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UsageError(Exception):
    """Bad arguments, or a path that does not exist or is not what the command needs."""


class CommandError(Exception):
    """The command could not do its job (I/O error, the engine refused): exit code 1."""


def set_handler(parser: argparse.ArgumentParser, handler: Handler) -> None:
    parser.set_defaults(handler=handler)


def get_handler(args: argparse.Namespace) -> Handler | None:
    handler: Any = getattr(args, "handler", None)
    return handler if callable(handler) else None


def discard_stdout() -> None:
    """Send the rest of standard output nowhere: its reader went away (``| head``), and the
    interpreter's final flush must not fail on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse ``type``: a decimal integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}: {value}")
        return value

    return parse


positive_int = int_at_least(1)  # counts and sizes
non_negative_int = int_at_least(0)  # epochs and offsets
