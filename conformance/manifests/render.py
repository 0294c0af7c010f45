"""Render the plugin's Kubernetes manifests (namespace, bootstrap and plugin DaemonSets) per target."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final

import jinja2
import yaml

DEFAULT_NAMESPACE: Final = "hyperlight-system"
DEFAULT_POOL_TAINT: Final = "hyperlight.dev/conformance"
HOST_DEV_VIEW: Final = "/host-dev"
PLUGIN_DIR: Final = "/var/lib/kubelet/device-plugins"
CDI_DIR: Final = "/var/run/cdi"
HYPERVISOR_LABEL: Final = "hyperlight.dev/hypervisor"
DEVICE_ACCESS_RESOURCE: Final = "hyperlight.dev/device-access"


class ManifestError(ValueError):
    """A render parameter that would produce unsafe or invalid manifests."""


@dataclass(frozen=True)
class Target:
    """What differs between clusters: the hypervisor device, pull policy and node constraints."""

    name: str
    hypervisor: str
    pull_policy: str
    arch: str | None

    @property
    def device(self) -> str:
        return f"/dev/{self.hypervisor}"


_TARGETS: Final = {
    # kind nodes only have what `kind load` put there: Never fails fast on a missing load
    # instead of silently pulling a different image from a registry.
    "kind": Target("kind", "kvm", "Never", None),
    "aks": Target("aks", "kvm", "IfNotPresent", None),
    # MSHV root-partition images exist for x86-64 only.
    "aks-mshv": Target("aks-mshv", "mshv", "IfNotPresent", "amd64"),
}
TARGETS: Final = tuple(_TARGETS)

# Docker reference grammar (distribution/reference), without IPv6 registry hosts.
_DOMAIN = (
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE_RE: Final = re.compile(
    rf"^(?P<name>(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?$"
)
_DNS_LABEL: Final = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN: Final = re.compile(
    r"^(?=.{1,253}$)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$"
)
_LABEL_NAME: Final = re.compile(r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def default_image() -> str:
    """`hv-device-plugin:<installed version>`: a pinned tag, never latest."""
    try:
        version = metadata.version("hv-device-plugin")
    except metadata.PackageNotFoundError:
        version = "0.0.0"
    return f"hv-device-plugin:{version}"


def check_image(image: str) -> str:
    """Return `image` when it is a valid reference pinned by a tag other than latest or a digest."""
    match = _IMAGE_RE.fullmatch(image)
    if match is None:
        raise ManifestError(f"image {image!r} is not a valid image reference")
    tag, digest = match.group("tag"), match.group("digest")
    if tag is not None and tag.lower() == "latest":
        raise ManifestError(
            f"image {image!r} refused: ':latest' is mutable and kind never re-pulls it; "
            "use a version tag or a digest"
        )
    if tag is None and digest is None:
        raise ManifestError(
            f"image {image!r} refused: no tag means ':latest'; use a version tag or a digest"
        )
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


def _yaml_string(value: object) -> str:
    # A JSON string is a valid YAML flow scalar: quoting every parameter keeps a value such as
    # "no" or "1.0" a string and stops any value from injecting YAML structure.
    return json.dumps(str(value))


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(  # noqa: S701 - YAML output, not HTML; parameters are quoted by `q`
        loader=jinja2.PackageLoader("conformance.manifests", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["q"] = _yaml_string
    return env


def _daemonsets(target: Target) -> list[dict[str, Any]]:
    """The two DaemonSets: what differs between them, the template holds what they share."""
    common = ["--hypervisor-device", target.device, "--host-dev-dir", HOST_DEV_VIEW]
    return [
        {
            "name": f"hv-device-access-{target.hypervisor}",
            "component": "device-access",
            "mode": "device-access",
            "args": ["--mode", "device-access", *common, "--device-plugin-dir", PLUGIN_DIR],
            "cdi": False,
            "requests": {"cpu": "20m", "memory": "96Mi"},
            "limits": {"cpu": "500m", "memory": "192Mi"},
        },
        {
            "name": f"hv-device-plugin-{target.hypervisor}",
            "component": "hypervisor-plugin",
            "mode": "hypervisor",
            "args": [
                "--mode",
                "hypervisor",
                *common,
                "--device-plugin-dir",
                PLUGIN_DIR,
                "--cdi-dir",
                CDI_DIR,
            ],
            "cdi": True,
            # Extended resources must have requests equal to limits.
            "requests": {"cpu": "50m", "memory": "128Mi", DEVICE_ACCESS_RESOURCE: "1"},
            "limits": {"cpu": "500m", "memory": "256Mi", DEVICE_ACCESS_RESOURCE: "1"},
        },
    ]


def render_manifests(
    target: str,
    *,
    image: str,
    namespace: str = DEFAULT_NAMESPACE,
    pool_taint: str | None = DEFAULT_POOL_TAINT,
) -> str:
    """Multi-document YAML for `target`; `pool_taint=None` renders no toleration."""
    if target not in _TARGETS:
        raise ManifestError(f"unknown target {target!r}; choose one of {', '.join(TARGETS)}")
    spec = _TARGETS[target]
    context: dict[str, Any] = {
        "target": spec,
        "image": check_image(image),
        "namespace": _check_namespace(namespace),
        "pool_taint": None if pool_taint is None else _check_taint_key(pool_taint),
        "hypervisor_label": HYPERVISOR_LABEL,
        "host_dev_view": HOST_DEV_VIEW,
        "plugin_dir": PLUGIN_DIR,
        "cdi_dir": CDI_DIR,
    }
    env = _environment()
    docs = [env.get_template("namespace.yaml.j2").render(context)]
    docs += [
        env.get_template("daemonset.yaml.j2").render(context, ds=ds) for ds in _daemonsets(spec)
    ]
    header = (
        f"# Rendered by `hvconform manifests --target {target}`; edit the templates in\n"
        "# conformance/manifests/templates, never this output.\n"
    )
    return header + "---\n".join(docs)


def render_objects(
    target: str,
    *,
    image: str,
    namespace: str = DEFAULT_NAMESPACE,
    pool_taint: str | None = DEFAULT_POOL_TAINT,
) -> list[dict[str, Any]]:
    """The rendered manifests parsed into one dict per Kubernetes object, in apply order."""
    text = render_manifests(target, image=image, namespace=namespace, pool_taint=pool_taint)
    objects: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(text):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise ManifestError(f"rendered document is not a mapping: {doc!r}")
        objects.append(doc)
    return objects
