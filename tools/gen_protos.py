"""Regenerate the stubs of plugin/api/*.proto (device plugin v1beta1, DRA v1, plugin registration).

Run with `nox -s protos` (or `python tools/gen_protos.py`). The output is
deterministic for a given grpcio-tools/mypy-protobuf version, and a test
checks that the committed stubs match a fresh generation.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import tomllib
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = (
    "plugin/api/deviceplugin.proto",
    "plugin/api/dra.proto",
    "plugin/api/drahealth.proto",
    "plugin/api/pluginregistration.proto",
)


def import_name() -> str:
    """The plugin's import name (pyproject.toml's [tool.setuptools.package-dir]): protoc names
    the stubs' modules, and their imports of each other, after the .proto's path."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        names = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return next(name for name, folder in names.items() if folder == "plugin")


def generate(out_dir: Path) -> Path:
    """The stubs, generated below out_dir/<import name>/api/ (returned)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # protoc finds protoc-gen-mypy on PATH; it lives beside this interpreter.
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    name = import_name()
    with tempfile.TemporaryDirectory() as tmp:
        # The .protos under the import name's path, so that the modules are hv_device_plugin.api.*
        include = Path(tmp)
        for proto in PROTOS:
            dest = include / name / Path(proto).relative_to("plugin")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / proto, dest)
        args = [
            "protoc",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            f"--mypy_out={out_dir}",
            f"--mypy_grpc_out={out_dir}",
            *(f"{name}/{Path(proto).relative_to('plugin')}" for proto in PROTOS),
        ]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
    return out_dir / name / "api"


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as out:
        fresh = generate(Path(out))
        for stub in sorted(fresh.glob("*_pb2*")):
            shutil.copyfile(stub, ROOT / "plugin" / "api" / stub.name)
