"""The container runtime a node ran, as the running daemon says it (issue 38, item 4).

Which runtime, its version, and its CDI configuration (enabled or not, the spec dirs it reads)
are asked from the daemon itself through CRI (`crictl version`, whose `Key:  value` lines carry
no JSON option in cri-tools v1.35, and `crictl info`'s JSON), never from a
config file or a package version: a runtime whose CDI is off drops the devices a plugin's
allocation names (containerd 2.0's silent drop), and the report must say so about the runtime,
not about the plugin. The keys are read wherever they sit under `config` (containerd 1.7 keeps
them in the CRI plugin's config, 2.x in its runtime config: both report `enableCDI` and
`cdiSpecDirs` there). Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

# Both as one shell command on a node ($c: its crictl): the version's lines, a separator line,
# then the info's JSON.
SEPARATOR = "---hvconform---"
CRICTL_FACTS = f'$c version && echo "{SEPARATOR}" && $c info'


@dataclass(frozen=True)
class RuntimeFacts:
    name: str  # as CRI names it (containerd, cri-o)
    version: str  # the daemon's own
    api_version: str  # CRI's
    cdi_enabled: bool | None  # None: the daemon's info does not say
    cdi_spec_dirs: tuple[str, ...]
    source: str  # how it was asked ("crictl on node hv-node")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cdi_spec_dirs"] = list(self.cdi_spec_dirs)
        return data


class RuntimeFactsError(ValueError):
    """What the daemon answered is not crictl's JSON (the message says which part)."""


def _find(tree: Any, key: str) -> Any:
    """The first value of `key` in a JSON tree, depth first; None when absent."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for value in tree.values():
            found = _find(value, key)
            if found is not None:
                return found
    if isinstance(tree, list):
        for value in tree:
            found = _find(value, key)
            if found is not None:
                return found
    return None


def _json(text: str, what: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise RuntimeFactsError(f"{what} is not JSON: {text.strip()[:200]!r}") from exc
    if not isinstance(data, dict):
        raise RuntimeFactsError(f"{what} is not a JSON object")
    return data


def _version(text: str) -> dict[str, str]:
    """`crictl version`'s `Key:  value` lines as a mapping."""
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            found[key.strip()] = value.strip()
    if "RuntimeName" not in found:
        raise RuntimeFactsError(f"crictl version named no runtime: {text.strip()[:200]!r}")
    return found


def from_crictl(version_text: str, info_json: str, source: str) -> RuntimeFacts:
    """The facts from `crictl version` and `crictl info` as the node printed them."""
    version = _version(version_text)
    info = _json(info_json, "crictl info")
    config = info.get("config", {})
    enabled = _find(config, "enableCDI")
    dirs = _find(config, "cdiSpecDirs")
    return RuntimeFacts(
        name=version["RuntimeName"],
        version=version.get("RuntimeVersion", ""),
        api_version=version.get("RuntimeApiVersion", ""),
        cdi_enabled=enabled if isinstance(enabled, bool) else None,
        cdi_spec_dirs=tuple(str(d) for d in dirs) if isinstance(dirs, list) else (),
        source=source,
    )


CDI_FIX = (
    "enable CDI in the runtime (containerd: enable_cdi = true under "
    "[plugins.'io.containerd.cri.v1.runtime'] in config version 3, under "
    '[plugins."io.containerd.grpc.v1.cri"] in version 2) and restart it'
)


def cdi_off(facts: RuntimeFacts, seen: str) -> str:
    """The runtime, not the plugin, keeps the device from workloads: its CDI is off and `seen`
    says what that did (containerd 2.0 dropped CDI requests silently; 2.2 and later refuse the
    container). '' when the runtime does not report CDI off."""
    if facts.cdi_enabled is not False:
        return ""
    return (
        f"the container runtime keeps CDI devices from workloads: {facts.name} {facts.version} "
        f"reports CDI off ({facts.source}), and {seen}; fix: {CDI_FIX}"
    )


def _same_dir(a: str, b: str) -> bool:
    """Two spellings of one directory: trailing slashes, and /var/run, which is /run on every
    distribution that ships a CRI runtime (a symlink the node's own paths go through)."""

    def norm(path: str) -> str:
        path = path.rstrip("/") or "/"
        return "/run" + path[len("/var/run") :] if path.startswith("/var/run") else path

    return norm(a) == norm(b)


def cdi_unread(facts: RuntimeFacts, spec_dir: str, seen: str) -> str:
    """The runtime, not the plugin, cannot resolve the devices the plugin's allocations name:
    its CDI is on, but the spec dirs it reports do not include the one the plugin writes its
    spec to (`spec_dir`, as the node sees it), so every name the plugin answers is unknown to
    it (containerd 2.2 and later refuse the container; 2.0 dropped the device). The plugin's
    spec is where its configuration says; the two disagree by deployment, and the fix is on
    either side. '' when the runtime reads that dir, or does not say which it reads."""
    if facts.cdi_enabled is not True or not facts.cdi_spec_dirs or not spec_dir:
        return ""
    if any(_same_dir(d, spec_dir) for d in facts.cdi_spec_dirs):
        return ""
    return (
        f"the container runtime cannot resolve the plugin's CDI devices: {facts.name} "
        f"{facts.version} reads CDI specs from {', '.join(facts.cdi_spec_dirs)} "
        f"({facts.source}), the plugin writes its spec to {spec_dir}, and {seen}; fix: add "
        f"{spec_dir} to the runtime's cdi_spec_dirs (containerd: beside enable_cdi) and restart "
        "it, or deploy the plugin with its CDI dir one of those"
    )


def runtime_side(facts: RuntimeFacts, spec_dir: str, seen: str) -> str:
    """Why the runtime, not the plugin, keeps CDI devices from workloads (CDI off, or the
    plugin's spec dir unread), or ''."""
    return cdi_off(facts, seen) or cdi_unread(facts, spec_dir, seen)


def from_output(output: str, source: str) -> RuntimeFacts:
    """The facts from CRICTL_FACTS's output (the two JSON documents around SEPARATOR)."""
    version, sep, info = output.partition(SEPARATOR)
    if not sep:
        raise RuntimeFactsError(f"no crictl info after its version: {output.strip()[:200]!r}")
    return from_crictl(version, info, source)
