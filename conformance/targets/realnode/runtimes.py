"""The container runtimes the real node runs (issue 38): which containerd, its shim and runc, and
the configuration each reads.

- `containerd-1.7`: Debian trixie's containerd 1.7.24 and its runc, on PATH (`nox -s node-deps`,
  pinned), configured in config version 2 (CDI under the CRI plugin,
  `plugins."io.containerd.grpc.v1.cri"`).
- `containerd-2.3`: containerd CONTAINERD2_VERSION and runc RUNC_VERSION built from their modules
  into CONTAINERD2_BIN (`nox -s node-build -- containerd2 runc`), configured in config version 3
  (CDI under the CRI runtime plugin, `plugins.'io.containerd.cri.v1.runtime'`), as containerd 2.x
  nodes (AKS, current kind images) are.

The node starts containerd with the runtime's directory first on PATH, so its shim and the shim's
runc are that runtime's own; the config names runc by path as well.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hvconform.targets.realnode import CONTAINERD2_BIN, CONTAINERD2_VERSION, RUNC_VERSION


@dataclass(frozen=True)
class NodeRuntime:
    name: str
    about: str
    bin_dir: Path | None  # containerd, containerd-shim-runc-v2 and runc; None: PATH's
    config_version: int  # the containerd config format it is given
    fix: str  # how to get it when it is missing
    cdi: bool = True  # False: a stand-in for a runtime that drops CDI requests
    # True: a stand-in for a runtime whose CDI spec dirs miss the plugin's (CDI on, the spec
    # unresolvable): it reads a sibling of the node's CDI dir that nothing writes to
    cdi_elsewhere: bool = False

    def cdi_dir(self, node_dir: Path) -> Path:
        """The CDI spec dir this runtime's containerd reads, for a node whose plugin writes to
        node_dir."""
        return node_dir.with_name(node_dir.name + "-unread") if self.cdi_elsewhere else node_dir

    def binary(self, program: str) -> str:
        """The runtime's own `program`, or PATH's (absolute either way; '' when absent)."""
        if self.bin_dir is not None:
            path = self.bin_dir / program
            return str(path) if path.is_file() and os.access(path, os.X_OK) else ""
        return shutil.which(program) or ""

    def missing(self) -> list[str]:
        return [p for p in ("containerd", "containerd-shim-runc-v2", "runc") if not self.binary(p)]

    def env(self) -> dict[str, str]:
        """containerd's environment: the runtime's directory first, so its shim is the one found."""
        path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        return {**os.environ, "PATH": f"{self.bin_dir}:{path}" if self.bin_dir else path}


RUNTIMES: dict[str, NodeRuntime] = {
    "containerd-1.7": NodeRuntime(
        "containerd-1.7",
        "Debian trixie's containerd 1.7.24 and runc (pinned), config version 2",
        None,
        2,
        "nox -s node-deps (containerd 1.7.24 from Debian trixie, pinned; gobuild/README.md)",
    ),
    "containerd-2.3": NodeRuntime(
        "containerd-2.3",
        f"containerd {CONTAINERD2_VERSION} and runc {RUNC_VERSION} built from their modules, "
        "config version 3",
        CONTAINERD2_BIN,
        3,
        "nox -s node-build -- containerd2 runc",
    ),
    # containerd 2.0 dropped the CDI devices of a request in some configurations, silently,
    # until 2.2 made it an error (containerd issues 12651, 12674): a runtime with CDI off is
    # the reproducible stand-in, and the suite must name the runtime, not the plugin.
    "containerd-2.3-cdi-off": NodeRuntime(
        "containerd-2.3-cdi-off",
        "containerd-2.3 with CDI disabled: a stand-in for a runtime that drops CDI requests",
        CONTAINERD2_BIN,
        3,
        "nox -s node-build -- containerd2 runc",
        cdi=False,
    ),
    # A spec the runtime cannot resolve: CDI on, but not in the dir the plugin writes to (a
    # deployment whose plugin and runtime disagree on the dir). The runtime's side as well.
    "containerd-2.3-cdi-elsewhere": NodeRuntime(
        "containerd-2.3-cdi-elsewhere",
        "containerd-2.3 reading CDI specs from a dir the plugin does not write to: a stand-in "
        "for a spec the runtime cannot resolve",
        CONTAINERD2_BIN,
        3,
        "nox -s node-build -- containerd2 runc",
        cdi_elsewhere=True,
    ),
}
DEFAULT = "containerd-1.7"


def runtime(name: str) -> NodeRuntime:
    """The runtime named `name` ('' is the default); ValueError lists the choices."""
    found = RUNTIMES.get(name or DEFAULT)
    if found is None:
        raise ValueError(f"unknown node runtime {name!r}: {', '.join(RUNTIMES)}")
    return found
