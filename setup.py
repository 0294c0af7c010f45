"""The build step pyproject.toml cannot say: the suite's data files into the wheel.

The Helm chart, kind's cluster configs and the shipped profiles stay in the repository's folders
(charts/, kind/, conformance/profiles/). `build_py` copies them into the built package as
hvconform/_data/, in their repository layout (conformance/contract/datafiles.py says what and
why, and finds them at run time), so an installed wheel needs no checkout and puts no top-level
`charts` or `kind` into site-packages. An editable install (`pip install -e .`) skips the copy:
it reads the checkout's own files, which stay current as they are edited. The sdist carries the
sources of the copy (MANIFEST.in), so a wheel built from it is the same.
"""

from __future__ import annotations

import importlib.util
import shutil
import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _packages() -> list[str]:
    """Every package below each folder of pyproject.toml's [tool.setuptools.package-dir],
    under the import name that table gives it."""
    with (ROOT / "pyproject.toml").open("rb") as f:
        names = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    found = []
    for name, folder in names.items():
        # Namespace packages too: a data directory (report/templates, profiles) is one, and
        # package-data's patterns match only within packages.
        subs = find_namespace_packages(str(ROOT / folder), exclude=["*__pycache__*", "_data*"])
        found += [name, *(f"{name}.{sub}" for sub in subs)]
    return found


def _datafiles() -> tuple[str, tuple[str, ...]]:
    """DATA_DIR and SHIPPED, read from the one module that defines them (loaded by path: the
    package is not importable while it is being built)."""
    path = ROOT / "conformance" / "contract" / "datafiles.py"
    spec = importlib.util.spec_from_file_location("_hv_datafiles", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DATA_DIR, tuple(module.SHIPPED)


class BuildPyWithData(build_py):
    """build_py, then the data files copied below build_lib/hvconform/_data."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return  # the checkout's own files are read (datafiles.data_root)
        data_dir, shipped = _datafiles()
        dest = Path(self.build_lib) / "hvconform" / data_dir
        shutil.rmtree(dest, ignore_errors=True)  # a previous build's copy never lingers
        for rel in shipped:
            source, target = ROOT / rel, dest / rel
            if source.is_dir():
                shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, target)
            else:
                raise FileNotFoundError(f"{rel}: the wheel's data file is missing from {ROOT}")


setup(packages=_packages(), cmdclass={"build_py": BuildPyWithData})
