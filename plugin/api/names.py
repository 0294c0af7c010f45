"""This project's public names: what a cluster, a runtime and an operator see of the plugin.

Defined once here (beside the wire constants) because the plugin, the manifests, the chart and
the conformance suite's own profile of this plugin all use them, and conformance may import only
hv_device_plugin.api from the plugin.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Final

# The extended resource a workload requests to get the hypervisor, injected by CDI.
HYPERVISOR_RESOURCE: Final = "hyperlight.dev/hypervisor"
# The bootstrap resource the plugin's own DaemonSet requests to reach the device unprivileged.
DEVICE_ACCESS_RESOURCE: Final = "hyperlight.dev/device-access"
# The DRA driver name of the plugin's DRA mode (a DNS subdomain; its ResourceSlices, its
# DeviceClass and its plugin registration carry it).
DRA_DRIVER: Final = "hypervisor.hyperlight.dev"
# The DRA mode's DRAPlugin endpoint (with gRPC Health) in its plugin dir.
DRA_SOCKET: Final = "dra.sock"
# The CDI kind of the injected device: by design the same string as the resource name.
CDI_KIND: Final = HYPERVISOR_RESOURCE
# The one CDI spec file the plugin owns in the CDI directory.
SPEC_FILENAME: Final = "hyperlight.json"
# Image repositories of the plugin and of the conformance guest workload.
PLUGIN_IMAGE_REPOSITORY: Final = "hv-device-plugin"
GUEST_IMAGE_REPOSITORY: Final = "hv-guest"
# The Python distribution (pyproject.toml's name), whose installed version tags the image.
DISTRIBUTION: Final = "hv-device-plugin"


def installed_version() -> str:
    """The installed distribution's version (pyproject.toml defines it once).

    Read from the name of its `<name>-<version>.dist-info` directory, first on sys.path as
    importlib.metadata would find it, without importing importlib.metadata: that import (email
    parsing and more) was a tenth of the plugin's start-up."""
    prefix, suffix = DISTRIBUTION.replace("-", "_") + "-", ".dist-info"
    for entry in sys.path:
        try:
            names = [p.name for p in Path(entry or ".").iterdir()]
        except OSError:  # a zip file, a missing directory
            continue
        for name in names:
            if name.startswith(prefix) and name.endswith(suffix):
                return name[len(prefix) : -len(suffix)]
    return "0.0.0"  # a source tree that was never installed


def default_plugin_image() -> str:
    """`hv-device-plugin:<installed version>`: a pinned tag, never latest."""
    return f"{PLUGIN_IMAGE_REPOSITORY}:{installed_version()}"


def default_guest_image() -> str:
    """`hv-guest:<installed version>`: the suite's workload image, whatever plugin is tested."""
    return f"{GUEST_IMAGE_REPOSITORY}:{installed_version()}"
