"""Wire constants of the kubelet device plugin API v1beta1, beside the .proto they belong to.

The kubelet, every plugin and every harness must agree on these byte for byte; they are facts
of the protocol (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 constants.go), not of this
project. The plugin, the kubelet emulator, the manifests and the tests import them from here.
"""

from __future__ import annotations

from typing import Final

# The only API version a v1beta1 kubelet accepts in RegisterRequest.version.
API_VERSION: Final = "v1beta1"
# Device.health values streamed by ListAndWatch.
HEALTHY: Final = "Healthy"
UNHEALTHY: Final = "Unhealthy"
# Where the kubelet listens for registrations and looks for plugin sockets.
DEVICE_PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
KUBELET_SOCKET: Final = "kubelet.sock"
# The kubelet's pod-resources API socket and its directory.
POD_RESOURCES_DIR: Final = "/var/lib/kubelet/pod-resources"
# The CDI specification's spec directories, in priority order (later wins).
CDI_STATIC_DIR: Final = "/etc/cdi"
CDI_DYNAMIC_DIR: Final = "/var/run/cdi"
