"""Regenerate, or check, the committed Python code for the ``.proto`` files in this package.

    python -m proto.generate          # rewrite proto/<name>_pb2.py, .pyi (and _grpc.py)
    python -m proto.generate --check  # exit 1 if the committed files differ from a fresh run

How this works: ``grpc_tools.protoc`` runs with the repository root as its include path on
``proto/raft.proto``, writing into a temporary directory. Because the file is named by its
package path, the generated gRPC module imports ``from proto import raft_pb2`` (not the bare
``import raft_pb2`` that breaks inside a package) and the descriptor is registered as
``proto/raft.proto``, so no textual post-processing is needed; the import is still checked.
Generation is deterministic for a given grpcio-tools version, which is therefore pinned
(``GRPC_TOOLS_VERSION``, and ``grpcio-tools==`` in pyproject's dev extra): the generated
files name it and the protobuf runtime version they require.
"""

from __future__ import annotations

import argparse
import difflib
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

GRPC_TOOLS_VERSION = "1.85.1"
PROTO_DIR = Path(__file__).resolve().parent
REPO = PROTO_DIR.parent
SOURCES = ("raft.proto", "metadata.proto", "controller.proto", "replica.proto")
MAX_DIFF_LINES = 40


def has_service(source: str) -> bool:
    text = (PROTO_DIR / source).read_text()
    return any(line.startswith("service ") for line in text.splitlines())


def generated_names(source: str) -> tuple[str, ...]:
    """The committed files for ``source``: messages, their stubs, and gRPC code if it
    defines a service."""
    stem = Path(source).stem
    messages = (f"{stem}_pb2.py", f"{stem}_pb2.pyi")
    return (*messages, f"{stem}_pb2_grpc.py") if has_service(source) else messages


def generate(out_root: Path) -> dict[str, bytes]:
    """Run protoc into ``out_root``; return each generated file's name and contents."""
    sources = [f"{PROTO_DIR.name}/{source}" for source in SOURCES]
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"--proto_path={REPO}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *sources,
    ]
    completed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if completed.returncode != 0:
        raise SystemExit(f"protoc failed ({completed.returncode}):\n{completed.stderr}")
    files: dict[str, bytes] = {}
    for source in SOURCES:
        for name in generated_names(source):
            files[name] = (out_root / PROTO_DIR.name / name).read_bytes()
        if has_service(source):
            _check_package_import(source, files[generated_names(source)[2]])
    return files


def _check_package_import(source: str, grpc_module: bytes) -> None:
    stem = Path(source).stem
    wanted = f"from {PROTO_DIR.name} import {stem}_pb2 as".encode()
    if wanted not in grpc_module:
        raise SystemExit(f"{stem}_pb2_grpc.py does not import {stem}_pb2 through the package")


def _diff(name: str, committed: bytes | None, fresh: bytes) -> list[str]:
    old = [] if committed is None else committed.decode().splitlines()
    lines = list(
        difflib.unified_diff(
            old, fresh.decode().splitlines(), f"committed/{name}", f"fresh/{name}", lineterm=""
        )
    )
    return lines[:MAX_DIFF_LINES] + (["..."] if len(lines) > MAX_DIFF_LINES else [])


def check(fresh: dict[str, bytes]) -> int:
    stale = []
    for name, contents in fresh.items():
        path = PROTO_DIR / name
        committed = path.read_bytes() if path.exists() else None
        if committed != contents:
            stale.append(name)
            print("\n".join(_diff(name, committed, contents)))
    if not stale:
        print(f"proto: {len(fresh)} generated files match their .proto sources")
        return 0
    print(f"proto: out of date: {', '.join(stale)}; run `python -m proto.generate`")
    return 1


def _installed_tools_version() -> str:
    try:
        return metadata.version("grpcio-tools")
    except metadata.PackageNotFoundError:
        return "not installed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m proto.generate", description=__doc__)
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed files, write nothing"
    )
    args = parser.parse_args(argv)
    installed = _installed_tools_version()
    if installed != GRPC_TOOLS_VERSION:
        print(f"proto: needs grpcio-tools=={GRPC_TOOLS_VERSION}, found {installed}")
        return 1
    with tempfile.TemporaryDirectory(prefix="proto-generate-") as tmp:
        fresh = generate(Path(tmp))
    if args.check:
        return check(fresh)
    for name, contents in fresh.items():
        (PROTO_DIR / name).write_bytes(contents)
    print(f"proto: wrote {', '.join(fresh)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
