"""What really ran as the plugin under test, read back from the running process or pod.

A report names only the plugin that ran: every target reads this from the running plugin itself
(the process's /proc/<pid>/cmdline and executable, the container's image ID from the engine, the
pod's spec image and the kubelet's imageID), never from the profile. `matches` compares it with
the profile: a run whose plugin is not the profile's is failed, never passed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class PluginRan:
    how: str  # "process", "container" or "pod"
    argv: tuple[str, ...] = ()  # as the kernel has it (/proc/<pid>/cmdline), or the pod spec's
    exe: str = ""  # /proc/<pid>/exe, as the plugin's mount namespace names it
    pid: int = 0  # the host pid, when the plugin runs on this machine
    image: str = ""  # the reference the container or pod was created from
    image_id: str = ""  # what the engine or the kubelet says it runs (sha256:... or name@digest)
    where: str = ""  # container name, or namespace/pod
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"], data["notes"] = list(self.argv), list(self.notes)
        return data
