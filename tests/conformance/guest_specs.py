"""CDI spec files for the guest and CDI-resolver tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_spec(
    path: Path,
    node: str,
    name: str = "kvm",
    env: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """One spec of kind hyperlight.dev/hypervisor with one device node at `node`."""
    edits: dict[str, Any] = {"deviceNodes": [{"path": node, "type": "c", "permissions": "rw"}]}
    if env:
        edits["env"] = env
    spec = {
        "cdiVersion": "0.6.0",
        "kind": "hyperlight.dev/hypervisor",
        "devices": [{"name": name, "containerEdits": edits}],
        **(extra or {}),
    }
    path.write_text(json.dumps(spec))
