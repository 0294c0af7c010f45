"""The node-init convention: how a node whose kubelet is not a systemd unit is driven.

A node made by `node-up --nodes N` (hvconform.targets.realnode.nodes) has an init of its own as
PID 1 of its PID namespace, and publishes inside the node, in SELF:

    kubelet.pid   the kubelet's PID as seen inside the node
    kubelet.log   the kubelet's output, each line prefixed with the wall-clock time it was written
    crictl        crictl bound to the node's own containerd

    kubelet.hold  while it exists, a kubelet that exits is not started again (the node's
                  `systemctl stop kubelet`; removing it is `systemctl start kubelet`)

and restarts its kubelet gracefully on SIGHUP to PID 1 (a SIGKILL to the kubelet is a crash: the
init starts it again, as systemd's Restart=always does). Node access (hvconform.targets.cluster)
uses these where present and systemd/journald otherwise, so the same scripts serve kind, AKS and
the nodes of this machine. Defined once here, where both families meet.
"""

from __future__ import annotations

from typing import Final

SELF: Final = "/run/hv-node/self"
KUBELET_PID: Final = f"{SELF}/kubelet.pid"
KUBELET_LOG: Final = f"{SELF}/kubelet.log"
HOLD_FILE: Final = "kubelet.hold"
KUBELET_HOLD: Final = f"{SELF}/{HOLD_FILE}"
CRICTL: Final = f"{SELF}/crictl"
