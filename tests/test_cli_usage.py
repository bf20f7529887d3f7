"""The command line's answers to usage mistakes and to Ctrl-C, without a cluster: a usage
mistake is exit 2 with one line naming it, never a traceback or exit 1; Ctrl-C in a client
command is exit 130 with no traceback. ``produce``'s and ``consume``'s checks run in-process
(they fail before dialling anyone); Ctrl-C is sent to a real ``runnel`` process while it
waits for an answer from a listener that accepts connections and never answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from runnel.cli import main

REPO = Path(__file__).resolve().parent.parent
BOOTSTRAP = "127.0.0.1:1"  # never dialled: each mistake is found first
WAIT_S = 30


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--idempotent", "--acks", "1"], "--idempotent needs --acks all"),
        (["--idempotent", "--acks", "0"], "--idempotent needs --acks all"),
        (["--key-separator", ""], "argument --key-separator: must not be empty"),
        (["--header", "=v"], "argument --header: '=v' is not K=V"),
        (["--header", "no-equals"], "argument --header: 'no-equals' is not K=V"),
    ],
)
def test_produce_usage_mistakes_exit_2_with_one_line(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["produce", "events", "--bootstrap", BOOTSTRAP, *args]) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err.splitlines()[-1], err
    assert "Traceback" not in err


def test_consume_help_explains_from_partition_and_max_messages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["consume", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for words in ["earliest (default)", "latest", "OFFSET", "@TIMESTAMP_MS", "read partition P",
                  "stop after N records", '{"base64": ...}']:  # fmt: skip
        assert words in text, words


def test_a_negative_partition_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["consume", "events", "--bootstrap", BOOTSTRAP, "--partition", "-1"]) == 2
    assert "must be at least 0" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["topics", "list"], ["cluster", "status"]])
def test_ctrl_c_in_a_client_command_exits_130_without_a_traceback(command: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:
        silent.settimeout(WAIT_S)
        port = silent.getsockname()[1]
        child = subprocess.Popen(
            [sys.executable, "-m", "runnel", *command, "--bootstrap", f"127.0.0.1:{port}"],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            connection, _ = silent.accept()  # the command waits for an answer now
            with connection:
                child.send_signal(signal.SIGINT)
                _, err = child.communicate(timeout=WAIT_S)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate(timeout=WAIT_S)
    assert child.returncode == 130, err
    assert "Traceback" not in err and err.splitlines()[-1] == "runnel: interrupted", err


def test_an_invalid_node_config_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "node.toml"
    config.write_text('node_id = "x"\n')
    assert main(["node", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("runnel: error: invalid configuration (5 problems):\n"), err
    assert "node_id (" in err and "invalid config:" not in err
