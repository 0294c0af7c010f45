"""Where the suite's data files live: the wheel's copy inside the package, or the checkout.

What the suite reads at run time beside its modules (the Helm chart, kind's cluster configs, the
shipped profiles) lives in the repository's own folders (charts/, kind/, conformance/profiles/),
kept where they are for helm, kind and the people who edit them. A wheel cannot ship folders
outside its packages without putting top-level names into site-packages, so the build step
(setup.py, which reads SHIPPED from this file) copies them into the package as
`hvconform/_data/`, in their repository layout: a path relative to one of them (the shipped
profiles' `../../charts/hv-device-plugin`) holds in both places.

`data_root()` is that directory in an installed wheel, and the checkout the package is imported
from otherwise (`pip install -e .`, or running from source): an editable install reads the
repository's files themselves, so an edited chart is what the next run renders, with no copy
to go stale. Standard library only: setup.py loads this file by path before anything is built.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Final

# The package data directory the wheel ships (hvconform/_data), never present in a checkout.
DATA_DIR: Final = "_data"
# Each entry relative to the repository root, copied as is (a directory with all it holds).
SHIPPED: Final = (
    "charts/hv-device-plugin",
    "kind/cluster.yaml",
    "kind/cluster-kubelet-root.yaml",
    "conformance/profiles",
)


def import_name() -> str:
    """The suite's import name (hvconform): its folder's name (conformance/) is not one."""
    return __name__.split(".")[0]


def package_dir() -> Path:
    """The suite package's directory: site-packages/hvconform, or the checkout's conformance/."""
    return Path(str(resources.files(import_name())))


def data_root() -> Path:
    """The directory that holds SHIPPED in their repository layout: the wheel's
    hvconform/_data when it is there, else the directory the package is imported from (the
    checkout of an editable install). A consumer checks for its own file and says which one is
    missing."""
    package = package_dir()
    shipped = package / DATA_DIR
    return shipped if shipped.is_dir() else package.parent
