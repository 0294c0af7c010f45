"""The kubelet of a cluster node: its state, restarts (graceful and crash), registrations.

A systemd unit on kind and AKS (systemctl, journald); a node init elsewhere
(hvconform.contract.nodeinit: SIGHUP to PID 1, time-stamped log). Times come from the node's
own clock (socket mtime, log time), mapped onto this process's monotonic clock.
"""

from __future__ import annotations

import time

from hvconform.contract.nodeinit import KUBELET_HOLD, KUBELET_LOG, KUBELET_PID
from hvconform.contract.wait import wait_for
from hvconform.targets.cluster.access import NodeAccess, NodeAccessError
from hvconform.targets.cluster.plan import ClusterOptions

RESTART_DELAY_S = 0.5

# The kubelet is a systemd unit (kind, AKS) or run by a node init (hvconform.contract.nodeinit).
_HAS_INIT = f"[ -r {KUBELET_PID} ]"
KUBELET_STATE = (
    f'if {_HAS_INIT}; then pid=$(cat {KUBELET_PID}); [ -d "/proc/$pid" ] || pid=0; '
    "else pid=$(systemctl show -p MainPID --value kubelet); fi; "
    'printf "%s %s %s\\n" "$pid" '
    '"$(stat -c %.9Y "$1" 2>/dev/null || echo 0)" "$(date +%s.%N)"'
)  # $1: the kubelet's registration socket, where this node keeps it
# The kubelet's --root-dir (pods, emptyDir volumes): read from the running kubelet, since
# distributions move it. The device-plugin socket dir does NOT follow it: the v1.37.2 kubelet
# hard-codes /var/lib/kubelet/device-plugins (pkg/kubelet/cm/devicemanager/manager.go,
# NewManagerImpl: pluginapi.KubeletSocket), which is why that dir comes from the objects.
KUBELET_ROOT = (
    f"if {_HAS_INIT}; then pid=$(cat {KUBELET_PID}); "
    "else pid=$(systemctl show -p MainPID --value kubelet); fi; "
    "root=$(tr '\\0' '\\n' < /proc/$pid/cmdline | sed -n 's/^--root-dir=//p' | tail -n 1); "
    'echo "${root:-/var/lib/kubelet}"'
)
# Detached and a little later: node access through the diagnostic pod is an exec the kubelet
# carries, which the restart would cut before it could answer.
KUBELET_RESTART = (
    f'(sleep {RESTART_DELAY_S}; if {_HAS_INIT}; then if [ "$1" = crash ]; '
    f'then kill -KILL "$(cat {KUBELET_PID})"; else kill -HUP 1; fi; '
    'elif [ "$1" = crash ]; then systemctl kill --signal=SIGKILL kubelet; '
    "else systemctl restart kubelet; fi) </dev/null >/dev/null 2>&1 &"
)
# Held stopped until KUBELET_START ($1: graceful or crash), as `systemctl stop kubelet`: it
# returns once the kubelet is gone. A crash is a SIGKILL that systemd's Restart=always (or the
# node init) would answer: stopped (held) at once after it, so it stays down until the start.
KUBELET_STOP = (
    f"if {_HAS_INIT}; then touch {KUBELET_HOLD}; pid=$(cat {KUBELET_PID}); "
    '[ "$1" = crash ] && sig=KILL || sig=TERM; kill -s "$sig" "$pid" 2>/dev/null; '
    'while [ -d "/proc/$pid" ] && ! grep -q "^State:.*Z" "/proc/$pid/status" 2>/dev/null; '
    "do sleep 0.1; done; "
    'elif [ "$1" = crash ]; then systemctl kill --signal=SIGKILL kubelet && systemctl stop kubelet; '
    "else systemctl stop kubelet; fi"
)
# Started again; prints the node's wall-clock time first (its new socket is newer than that).
KUBELET_START = (
    f"date +%s.%N; if {_HAS_INIT}; then rm -f {KUBELET_HOLD}; else systemctl start kubelet; fi"
)
# The kubelet's log since $1 (unix time), each line led by its time: its own file under a node
# init, else its journal.
KUBELET_LOG_SINCE = (
    f"{{ if {_HAS_INIT}; then awk -v s=\"$1\" '$1 >= s' {KUBELET_LOG}; "
    'else journalctl -u kubelet -o short-unix --no-pager --since "@$1"; fi; }'
)
REGISTRATIONS = f'{KUBELET_LOG_SINCE} | grep -i "registration request" | grep -F "$2" | tail -n 1'
# Its lines since $1 holding $2 (none is no error).
KUBELET_LOG_LINES = f'{KUBELET_LOG_SINCE} | grep -F -- "$2" || true'


def to_monotonic(wall: float) -> float:
    """A node wall-clock time on this process's monotonic clock (kind: same clock; AKS: NTP)."""
    return wall - (time.time() - time.monotonic())


class KubeletControl:
    """Mixin of ClusterNode: the kubelet half of the Node protocol."""

    access: NodeAccess
    options: ClusterOptions
    _since: int
    _poll: float
    resource: str
    socket_path: str

    def _node(self, argv: list[str]) -> str:
        raise NotImplementedError

    def kubelet_root_dir(self) -> str:
        return self._node(["sh", "-c", KUBELET_ROOT]).strip() or "/var/lib/kubelet"

    def _kubelet_state(self) -> tuple[str, float, float]:
        pid, sock, now = self._node(["sh", "-c", KUBELET_STATE, "sh", self.socket_path]).split()
        return pid, float(sock), float(now)

    def restart_kubelet(self, graceful: bool) -> float:
        """Restart (or SIGKILL: systemd or the node init starts it again); back = its new
        registration socket's mtime."""
        old_pid, _, issued = self._kubelet_state()
        how = "graceful" if graceful else "crash"
        result = self.access.run(["sh", "-c", KUBELET_RESTART, "sh", how], timeout=120)
        assert result.rc == 0, f"kubelet {how} restart failed: {result.stderr.decode()[-300:]}"

        def back() -> float | None:
            try:
                pid, sock, _ = self._kubelet_state()
            except NodeAccessError:  # the pod route's exec needs the kubelet: not back yet
                return None
            return sock if pid not in ("0", old_pid) and sock > issued else None

        return to_monotonic(
            wait_for(back, self.options.pod_timeout, "kubelet back", min(0.2, self._poll))
        )

    def last_registration_at(self) -> float | None:
        script = ["sh", "-c", REGISTRATIONS, "sh", str(self._since), self.resource]
        line = self._node(script).strip()
        return to_monotonic(float(line.split()[0])) if line else None
