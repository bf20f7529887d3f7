"""Plumbing shared by the subcommand modules of the ``runnel`` command line.

A subcommand group (``log`` today; ``node``, ``cluster``, ``topics`` later) is a module with a
``register(subparsers)`` function. Each leaf command stores its handler on the parsed
arguments with :func:`set_handler`; :func:`runnel.cli.main` calls it and maps the two error
types below to exit codes, so handlers never call ``sys.exit`` themselves.

Exit codes: 0 success, 1 the command ran and found (or hit) a problem, 2 usage error.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeAlias

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

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


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts and sizes: a decimal integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse ``type`` for epochs and offsets: a decimal integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value
