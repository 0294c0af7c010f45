"""The plugin's Kubernetes manifests per target, rendered through the Helm chart.

charts/hv-device-plugin is the one source: a target is a values file of the chart
(charts/hv-device-plugin/targets/<target>.yaml), and `hvconform manifests --target T` prints
exactly what `helm template` prints for that file plus the image, namespace and pool taint given
here (tests/chart proves the two equal). Parameters are checked here first, so a bad one is
refused with one line before helm runs.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Final

from hv_device_plugin.api.names import HYPERVISOR_RESOURCE, default_plugin_image
from hv_device_plugin.api.wire import CDI_DYNAMIC_DIR, DEVICE_PLUGIN_DIR
from hvconform.contract import imageref
from hvconform.manifests.chart import (
    ChartError,
    ObjectError,
    load_objects,
    target_values,
    template,
)

DEFAULT_NAMESPACE: Final = "hyperlight-system"
DEFAULT_POOL_TAINT: Final = "hyperlight.dev/conformance"
HOST_DEV_VIEW: Final = "/host-dev"
PLUGIN_DIR: Final = DEVICE_PLUGIN_DIR
CDI_DIR: Final = CDI_DYNAMIC_DIR
KUBELET_ROOT: Final = PLUGIN_DIR.rsplit("/", 1)[0]  # /var/lib/kubelet
HYPERVISOR_LABEL: Final = HYPERVISOR_RESOURCE
# The chart's per-target values files, by target name.
TARGETS: Final = ("kind", "aks", "aks-mshv")


class ManifestError(ValueError):
    """A render parameter that would produce unsafe or invalid manifests."""


_DNS_LABEL: Final = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN: Final = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_NAME: Final = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def default_image() -> str:
    """`hv-device-plugin:<installed version>`: a pinned tag, never latest."""
    return default_plugin_image()


def _pinned(image: str) -> imageref.ImageRef:
    """The parts of a reference pinned by a tag other than latest or a digest
    (hvconform.contract.imageref, the suite's one definition); ManifestError otherwise."""
    try:
        return imageref.parse(image, pinned=True)
    except imageref.ImageRefError as exc:
        raise ManifestError(f"image {exc}") from None


def check_image(image: str) -> str:
    """Return `image` when it is a valid reference pinned by a tag other than latest or a digest."""
    _pinned(image)
    return image


def _check_namespace(namespace: str) -> str:
    if not _DNS_LABEL.fullmatch(namespace):
        raise ManifestError(f"namespace {namespace!r} is not a DNS-1123 label")
    return namespace


def _check_taint_key(key: str) -> str:
    prefix, _, name = key.rpartition("/")
    if (prefix and not _DNS_SUBDOMAIN.fullmatch(prefix)) or not _LABEL_NAME.fullmatch(name):
        raise ManifestError(f"pool taint key {key!r} is not a qualified name (prefix/name)")
    return key


def image_values(image: str) -> dict[str, str]:
    """The chart's image.repository, image.tag and image.digest of a checked reference."""
    ref = _pinned(image)
    return {"repository": ref.name, "tag": ref.tag, "digest": ref.digest}


def chart_values(
    image: str,
    pool_taint: str | None = DEFAULT_POOL_TAINT,
    kubelet_root: str = KUBELET_ROOT,
    cdi_dir: str = CDI_DIR,
) -> dict[str, Any]:
    """What hvconform sets on top of a target's values file: the namespace object, the image,
    the toleration of the run's pool taint (any value, any effect) and the node's kubelet root
    and CDI dirs (the chart's schema refuses unusable ones)."""
    tolerations = (
        [] if pool_taint is None else [{"key": _check_taint_key(pool_taint), "operator": "Exists"}]
    )
    return {
        "namespace": {"create": True},
        "image": image_values(image),
        "tolerations": tolerations,
        "kubeletRootDir": kubelet_root,
        "cdiDir": cdi_dir,
    }


@functools.lru_cache(maxsize=64)
def _render(
    target: str, image: str, namespace: str, pool_taint: str | None, dirs: tuple[str, str]
) -> str:
    values = chart_values(image, pool_taint, *dirs)
    try:
        return template(_check_namespace(namespace), [target_values(target)], values)
    except ChartError as exc:
        raise ManifestError(str(exc)) from None


def render_manifests(
    target: str,
    *,
    image: str,
    namespace: str = DEFAULT_NAMESPACE,
    pool_taint: str | None = DEFAULT_POOL_TAINT,
    kubelet_root: str = KUBELET_ROOT,
    cdi_dir: str = CDI_DIR,
) -> str:
    """Multi-document YAML for `target` (helm's output as is); `pool_taint=None` renders no
    toleration. Cached: helm runs once per distinct set of parameters."""
    if target not in TARGETS:
        raise ManifestError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    return _render(target, image, namespace, pool_taint, (kubelet_root, cdi_dir))


def render_objects(
    target: str,
    *,
    image: str,
    namespace: str = DEFAULT_NAMESPACE,
    pool_taint: str | None = DEFAULT_POOL_TAINT,
    kubelet_root: str = KUBELET_ROOT,
    cdi_dir: str = CDI_DIR,
) -> list[dict[str, Any]]:
    """The rendered manifests parsed into one dict per Kubernetes object, in apply order: read
    as a profile's manifests are (hvconform.manifests.chart.load_objects: the strict loader,
    one run's caps, a valid name on every object); ManifestError (one line) otherwise."""
    text = render_manifests(
        target,
        image=image,
        namespace=namespace,
        pool_taint=pool_taint,
        kubelet_root=kubelet_root,
        cdi_dir=cdi_dir,
    )
    try:
        return load_objects(text, f"helm template for target {target}")
    except ObjectError as exc:
        raise ManifestError(str(exc)) from None
