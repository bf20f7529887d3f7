"""The codec is a pure library: no I/O, no clocks, no event loop, no other runnel package."""

from __future__ import annotations

import ast
from pathlib import Path

import broker.protocol

ALLOWED = {
    "__future__",
    "collections",
    "dataclasses",
    "enum",
    "functools",
    "struct",
    "types",
    "typing",
    "uuid",
    "broker",
}


def test_protocol_imports_no_io() -> None:
    package = Path(broker.protocol.__file__).parent
    for path in package.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                assert name.split(".")[0] in ALLOWED, f"{path.name} imports {name}"
                if name.startswith("broker"):
                    assert name.startswith("broker.protocol"), f"{path.name} imports {name}"
