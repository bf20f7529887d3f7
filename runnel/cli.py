"""The ``runnel`` command line (console script ``runnel``, also ``python -m runnel``).

How this works: :func:`build_parser` makes one argparse parser and asks each subcommand
group's module to ``register`` its subparsers (see ``commands.py``); :func:`main` parses,
runs the chosen handler and turns the outcome into an exit code. Groups so far:

    runnel log dump|verify|produce   read and write partition logs on disk (log_tools.py)
    runnel node --config FILE        run one node (node.py)
    runnel cluster up|down|status    a local cluster of node processes (cluster_command.py)
    runnel topics create|list|describe|delete|elect   topics, via the controller (topics_command.py)
    runnel produce TOPIC / runnel consume TOPIC  records, with confluent-kafka (*_command.py)
    runnel delete-records TOPIC --before N   drop records below N (delete_records_command.py)
    runnel replicas verify           compare partitions' replicas (replicas_command.py)

A later group adds one ``register`` call.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from runnel import (
    cluster_command,
    consume_command,
    delete_records_command,
    log_tools,
    node,
    produce_command,
    replicas_command,
    topics_command,
)
from runnel.commands import (
    EXIT_INTERRUPTED,
    EXIT_PROBLEM,
    EXIT_USAGE,
    CommandError,
    UsageError,
    discard_stdout,
    get_handler,
)

PROG = "runnel"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="runnel: a Kafka-compatible log broker."
    )
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    log_tools.register(groups)
    node.register(groups)
    cluster_command.register(groups)
    topics_command.register(groups)
    produce_command.register(groups)
    consume_command.register(groups)
    delete_records_command.register(groups)
    replicas_command.register(groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    # Only the main thread may set a handler (a test may run the CLI in another).
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, _interrupted) if main_thread else None
    try:
        return _run(argv)
    except KeyboardInterrupt:  # Ctrl-C: no traceback, the exit code a shell expects
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if main_thread:
            signal.signal(signal.SIGINT, previous)


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """Ctrl-C raises KeyboardInterrupt where the program is, as Python's default handler
    does. Not that handler itself: asyncio.run replaces it with one that cancels the main
    task instead, and a cancelled gRPC call can come back as a failed RPC, which the
    controller client retries until its deadline (exit 1 after 15 s, not 130). Commands
    that handle SIGINT themselves (node, cluster up, produce) install their own."""
    raise KeyboardInterrupt


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (2): argparse already printed
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    handler = get_handler(args)
    if handler is None:
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args)
    except UsageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except CommandError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_PROBLEM
    except BrokenPipeError:
        return _stdout_closed()


def _stdout_closed() -> int:
    """The reader went away (``runnel log dump | head``): exit quietly, as if by SIGPIPE."""
    discard_stdout()
    return 128 + signal.SIGPIPE
