"""Wire constants of the kubelet's DRA driver API (v1) and plugin registration, beside the
.protos they belong to (dra.proto, pluginregistration.proto).

Facts of the protocol, not of this project (k8s.io/kubelet/pkg/apis/dra/v1 types.go,
pluginregistration/v1 constants.go, the kubelet's kubeletconfig defaults.go, v1.37.2): the
DRA mode of the plugin, the suite's DRA checks and the tests import them from here.
"""

from __future__ import annotations

from typing import Final

# PluginInfo.type of a DRA driver's registration.
PLUGIN_TYPE_DRA: Final = "DRAPlugin"
# PluginInfo.supported_versions: the gRPC services the driver serves, as "<package>.<service>"
# with the package's last element; the kubelet picks the first one it knows.
DRA_SERVICE_V1: Final = "v1.DRAPlugin"
# The optional device-health stream (dra-health/v1): listed too, the kubelet opens it.
DRA_HEALTH_SERVICE_V1: Final = "v1.DRAResourceHealth"
# What the kubelet assumes when a report names no timeout: an entry not refreshed within it
# reads Unknown (v1.37.2 pkg/kubelet/cm/dra/healthinfo.go DefaultHealthTimeout).
DRA_HEALTH_DEFAULT_TIMEOUT_S: Final = 30
# Where the kubelet's plugin watcher looks for registration sockets, and where drivers keep
# their service sockets by convention, below the kubelet's --root-dir.
PLUGINS_REGISTRY_DIR: Final = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR: Final = "/var/lib/kubelet/plugins"
# The resource.k8s.io API version served by a v1.34+ API server (structured parameters GA).
RESOURCE_API: Final = "resource.k8s.io/v1"
