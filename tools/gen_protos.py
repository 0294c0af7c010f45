"""Regenerate the stubs of plugin/api/*.proto (device plugin v1beta1, DRA v1, plugin registration).

Run with `nox -s protos` (or `python tools/gen_protos.py`). The output is
deterministic for a given grpcio-tools/mypy-protobuf version, and a test
checks that the committed stubs match a fresh generation.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = (
    "plugin/api/deviceplugin.proto",
    "plugin/api/dra.proto",
    "plugin/api/drahealth.proto",
    "plugin/api/pluginregistration.proto",
)


def generate(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    # protoc finds protoc-gen-mypy on PATH; it lives beside this interpreter.
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    args = [
        "protoc",
        f"-I{ROOT}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--mypy_out={out_dir}",
        f"--mypy_grpc_out={out_dir}",
        *(str(ROOT / proto) for proto in PROTOS),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
