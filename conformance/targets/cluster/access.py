"""Node access: run a command on a cluster node, and the Node file operations built on it.

kind reaches its node with `docker exec` into the node container; AKS (and `--node-access pod`
anywhere) through a privileged diagnostic pod (hostPID) and `nsenter -t 1` into the host's
namespaces; `--node-access direct` when the node is this machine: argv runs here, in the
namespaces of that node's kubelet. All only run argv on the node, so every file operation is
one small POSIX shell script with its operands passed as arguments (never spliced into the
script), and file contents travel as base64 so bytes stay exact.
"""

from __future__ import annotations

import base64
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Protocol

from hv_device_plugin.api.wire import CDI_DYNAMIC_DIR, DEVICE_PLUGIN_DIR, KUBELET_SOCKET
from hvconform.contract.node import Area, FileInfo
from hvconform.targets.cluster.kube import ExecResult, KubeApi

CDI_DIR = CDI_DYNAMIC_DIR
STATE_DIR = "/var/lib/hvconform"  # everything the harness puts on a node, removed in cleanup
HOST_VIEW = f"{STATE_DIR}/host-dev"  # isolated host-device view: faults never touch real /dev
EMPTY_SOCKETS = f"{STATE_DIR}/empty-sockets"
RO_STAGING = f"{STATE_DIR}/ro-cdi"
KUBELET_SOCKET_PATH = f"{DEVICE_PLUGIN_DIR}/{KUBELET_SOCKET}"
MISSING = 3  # exit status the scripts use for "no such file"
EXISTS = 17

_TYPES = {
    "regular file": "file",
    "regular empty file": "file",
    "directory": "dir",
    "symbolic link": "symlink",
    "character special file": "char",
    "block special file": "block",
    "fifo": "fifo",
    "socket": "socket",
}

SCRIPTS = {
    "read": 'if [ -f "$1" ] && [ ! -L "$1" ]; then c=$(base64 "$1") || exit 3; '
    "printf 'OK\\n%s\\n' \"$c\"; else exit 3; fi",
    "write": 't="$(dirname "$1")/.hvconform-$(basename "$1").tmp"; '
    'printf %s "$2" | base64 -d > "$t" && chmod 0644 "$t" && mv -f "$t" "$1"',
    "stat": '[ -e "$1" ] || [ -L "$1" ] || exit 3; stat -c "%F|%a|%u|%g|%t|%T" "$1"',
    "remove": 'rm -f "$1"',
    "mkdir": 'mkdir "$1" 2>/dev/null && exit 0; { [ -e "$1" ] || [ -L "$1" ]; } && exit 17; exit 1',
    "replace-dir": '{ [ -d "$1" ] && [ ! -L "$1" ]; } && exit 17; rm -f "$1"; '
    'mkdir "$1" 2>/dev/null && exit 0; { [ -e "$1" ] || [ -L "$1" ]; } && exit 17; exit 1',
    "rmdir": 'rmdir "$1"',
    "list": 'ls -A1 "$1"',
    "mknod": 'mknod -m 0600 "$1" c "$2" "$3"',
    "replace-char": 't="$(dirname "$1")/.hvconform-$(basename "$1").new"; rm -f "$t"; '
    'mknod -m 0600 "$t" c "$2" "$3" && mv -f "$t" "$1"',
    "ro-on": 'set -e; mkdir -p "$2"; mount -t tmpfs -o size=1m,mode=0755 hvconform-ro "$2"; '
    'mount -o remount,ro "$2"; mount --bind "$2" "$1"',
    "ro-off": 'umount "$1"; umount "$2"',
}


class NodeAccessError(RuntimeError):
    """A node command failed in a way the operation does not expect."""


_GO_FRAME = re.compile(r"^\s+\S+\.go:\d+|^\S+\.\(?\*?[\w.]+\)?\.?[\w.]*\(?\)?$|^goroutine \d+")


def gist(stderr: str, limit: int = 900) -> str:
    """What a failed tool said, without its Go stack trace (kind and kubeadm append one after the
    error, and a tail-only excerpt kept nothing but frames): the error lines first, then the
    tail of the rest, within `limit` characters."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    kept: list[str] = []
    for i, line in enumerate(lines):
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if _GO_FRAME.match(line) or (nxt.startswith("\t") and ".go:" in nxt):
            continue
        kept.append(line)
    errors = [ln for ln in kept if re.search(r"error|failed|fatal|refused|denied", ln, re.I)]
    text = "\n".join(dict.fromkeys(errors[:6] + kept[-6:]))
    return text if len(text) <= limit else text[: limit // 2] + " [...] " + text[-limit // 2 :]


class CommandFailed(RuntimeError):
    def __init__(self, argv: list[str], rc: int, stderr: str) -> None:
        super().__init__(f"`{shlex.join(argv)[:300]}` exited {rc}: {gist(stderr)}")
        self.argv = argv
        self.rc = rc
        self.stderr = stderr


class CommandRunner:
    """Runs executables (kind, docker, az) with a deadline; every argv goes to a log first."""

    def __init__(self, log: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.log = log
        self.env = env

    def run(self, argv: list[str], *, timeout: float = 900, check: bool = True) -> ExecResult:
        if self.log is not None:
            self.log.parent.mkdir(parents=True, exist_ok=True)
            with self.log.open("a") as f:
                f.write(f"{time.strftime('%H:%M:%S')} $ {shlex.join(argv)}\n")
        try:
            # subprocess.run kills the child on any exception, Ctrl-C and timeouts included.
            proc = subprocess.run(argv, capture_output=True, timeout=timeout, env=self.env)
        except subprocess.TimeoutExpired:
            raise CommandFailed(argv, -9, f"timed out after {timeout:g}s") from None
        except FileNotFoundError:
            raise CommandFailed(argv, 127, f"{argv[0]}: executable not found on PATH") from None
        result = ExecResult(proc.returncode, proc.stdout, proc.stderr)
        if proc.returncode != 0 and self.log is not None:
            with self.log.open("a") as f:  # the whole answer: the exception keeps only its gist
                f.write(
                    f"  exited {proc.returncode}; stderr:\n{proc.stderr.decode(errors='replace')}\n"
                )
        if check and proc.returncode != 0:
            raise CommandFailed(argv, proc.returncode, proc.stderr.decode(errors="replace"))
        return result


class NodeAccess(Protocol):
    """Runs argv on one node as root, in the node's own namespaces."""

    where: str

    def run(self, argv: list[str], timeout: float = 60) -> ExecResult: ...
    def wrap(self, argv: list[str]) -> str: ...  # how it runs, for plans and errors


class DockerExecAccess:
    """kind: the node is a container; `docker exec` runs in its namespaces."""

    def __init__(self, runner: CommandRunner, container: str) -> None:
        self.runner = runner
        self.where = container

    def argv(self, argv: list[str]) -> list[str]:
        return ["docker", "exec", self.where, *argv]

    def run(self, argv: list[str], timeout: float = 60) -> ExecResult:
        return self.runner.run(self.argv(argv), timeout=timeout, check=False)

    def wrap(self, argv: list[str]) -> str:
        return shlex.join(self.argv(argv))

    def node_pid(self) -> int | None:
        """The node container's init as this machine sees it (the node is a container of this
        machine's engine); None when the engine does not say."""
        got = self.runner.run(
            ["docker", "inspect", "--format", "{{.State.Pid}}", self.where], check=False
        )
        pid = got.stdout.decode().strip()
        return int(pid) if got.rc == 0 and pid.isdigit() and pid != "0" else None

    def local_path(self, path: str) -> str | None:
        """The node's `path` as this machine reaches it: through the node container's root."""
        pid = self.node_pid()
        return f"/proc/{pid}/root{path}" if pid is not None else None


NSENTER = ["nsenter", "-t", "1", "-m", "-u", "-i", "-n", "-p", "--"]


class PodExecAccess:
    """AKS: a privileged hostPID diagnostic pod; nsenter into PID 1's namespaces is the host."""

    def __init__(self, api: KubeApi, namespace: str, pod: str) -> None:
        self.api = api
        self.namespace = namespace
        self.where = f"pod {namespace}/{pod}"
        self.pod = pod

    def run(self, argv: list[str], timeout: float = 60) -> ExecResult:
        try:
            return self.api.exec(self.namespace, self.pod, [*NSENTER, *argv], timeout=timeout)
        except (TimeoutError, NodeAccessError):
            raise
        except Exception as exc:  # the exec rides on the kubelet: down while it restarts
            raise NodeAccessError(f"exec in {self.where}: {type(exc).__name__}: {exc}") from exc

    def wrap(self, argv: list[str]) -> str:
        return pod_exec_text(self.pod, argv)

    def run_in_pod(self, argv: list[str], timeout: float = 60) -> ExecResult:
        """argv in the diagnostic container itself (its image's tools; hostPID: the node's
        files are under /proc/1/root)."""
        try:
            return self.api.exec(self.namespace, self.pod, argv, timeout=timeout)
        except TimeoutError:
            raise
        except Exception as exc:  # the exec rides on the kubelet: down while it restarts
            raise NodeAccessError(f"exec in {self.where}: {type(exc).__name__}: {exc}") from exc


class DirectAccess:
    """The node is this machine: its kubelet runs here (`--hostname-override` names the node).

    argv runs in that kubelet's namespaces, entered at the init of its PID namespace, which
    outlives kubelet restarts (on a node of `node-up --nodes N` that is the node's own init; a
    kubelet in this machine's own namespaces needs no nsenter at all)."""

    def __init__(self, node: str, runner: CommandRunner | None = None) -> None:
        self.node = node
        self.where = f"this machine (node {node})"
        self.runner = runner or CommandRunner()
        self._init: tuple[int, str] | None = None  # (pid, start time) of the node's init

    def _prefix(self) -> list[str]:
        if self._init is not None and _start_time(self._init[0]) == self._init[1]:
            return [*NSENTER[:2], str(self._init[0]), *NSENTER[3:]]
        kubelet = local_kubelet(self.node)
        if kubelet is None:
            raise NodeAccessError(f"no kubelet for node {self.node} runs on this machine")
        if _ns(kubelet, "pid") == _ns(os.getpid(), "pid"):
            return []  # the kubelet shares this machine's namespaces
        init = pid_namespace_init(kubelet)
        self._init = (init, _start_time(init))
        return [*NSENTER[:2], str(init), *NSENTER[3:]]

    def argv(self, argv: list[str]) -> list[str]:
        return [*self._prefix(), *argv]

    def run(self, argv: list[str], timeout: float = 60) -> ExecResult:
        return self.runner.run(self.argv(argv), timeout=timeout, check=False)

    def wrap(self, argv: list[str]) -> str:
        return f"(this machine, node {self.node}) {shlex.join(argv)}"

    def local_path(self, path: str) -> str | None:
        """The node's `path` from here: through its init's root when it has namespaces of its
        own, else the path itself."""
        prefix = self._prefix()
        return f"/proc/{prefix[2]}/root{path}" if prefix else path


class HostPidAccess:
    """The suite runs in a privileged hostPID pod on the node it judges (`--node-access
    host-pid`, the Sonobuoy plugin's pod): argv runs here, entered into the namespaces of PID 1,
    which is the node's init, as the diagnostic pod's exec does, without the exec's round trip."""

    def __init__(self, node: str, runner: CommandRunner | None = None) -> None:
        self.node = node
        self.where = f"this pod's node {node} (hostPID)"
        self.runner = runner or CommandRunner()

    def run(self, argv: list[str], timeout: float = 60) -> ExecResult:
        return self.runner.run([*NSENTER, *argv], timeout=timeout, check=False)

    def wrap(self, argv: list[str]) -> str:
        return f"(hostPID pod on node {self.node}) {shlex.join([*NSENTER, *argv])}"


def _ns(pid: int, kind: str) -> str:
    try:
        return str(Path(f"/proc/{pid}/ns/{kind}").readlink())
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def local_kubelet(node: str) -> int | None:
    """The pid of a kubelet on this machine registered as `node`, if any."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args and Path(args[0]).name == "kubelet" and f"--hostname-override={node}" in args:
            return int(entry.name)
    return None


def pid_namespace_init(pid: int) -> int:
    """The process that is PID 1 of `pid`'s PID namespace, by its pid on this machine."""
    target = _ns(pid, "pid")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or _ns(int(entry.name), "pid") != target:
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        nspid = next((ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), [])
        if nspid and nspid[-1] == "1":
            return int(entry.name)
    raise NodeAccessError(f"the PID namespace of kubelet {pid} has no init visible here")


def pod_exec_text(pod: str, argv: list[str]) -> str:
    """How a command through the diagnostic pod reads in a plan."""
    return f"exec {pod}: {shlex.join([*NSENTER, *argv])}"


def script(name: str, *args: str) -> list[str]:
    return ["sh", "-c", SCRIPTS[name], "sh", *args]


def parse_stat(line: str) -> FileInfo:
    kind, mode, uid, gid, major, minor = line.strip().split("|")
    return FileInfo(
        _TYPES.get(kind, "other"), int(mode, 8), int(uid), int(gid), int(major, 16), int(minor, 16)
    )


class NodeFiles:
    """The Node protocol's file operations, on a node reached through a NodeAccess."""

    def __init__(self, access: NodeAccess, host_view: str = HOST_VIEW) -> None:
        self.access = access
        self.dirs: dict[str, str] = {"cdi": CDI_DIR, "host_dev": host_view}

    def _path(self, area: Area, name: str) -> str:
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"not a plain file name: {name!r}")
        return f"{self.dirs[area]}/{name}"

    def sh(
        self, name: str, *args: str, ok: tuple[int, ...] = (0,), timeout: float = 60
    ) -> ExecResult:
        result = self.access.run(script(name, *args), timeout=timeout)
        if result.rc not in ok:
            raise NodeAccessError(
                f"node {self.access.where}: {name} {' '.join(args)[:120]} exited {result.rc}: "
                f"{result.stderr.decode(errors='replace').strip()[-300:]}"
            )
        return result

    def read_file(self, area: Area, name: str) -> bytes | None:
        return self.read_path(self._path(area, name))

    def read_path(self, path: str) -> bytes | None:
        """A regular file's exact bytes; None when missing or not a regular file."""
        result = self.sh("read", path, ok=(0, MISSING))
        head, _, body = result.stdout.partition(b"\n")
        if result.rc == MISSING or head != b"OK":
            return None
        return base64.b64decode(body)

    def write_file(self, area: Area, name: str, data: bytes) -> None:
        self.sh("write", self._path(area, name), base64.b64encode(data).decode())

    def stat(self, area: Area, name: str) -> FileInfo | None:
        return self.stat_path(self._path(area, name))

    def stat_path(self, path: str) -> FileInfo | None:
        result = self.sh("stat", path, ok=(0, MISSING))
        return None if result.rc == MISSING else parse_stat(result.stdout.decode())

    def remove(self, area: Area, name: str) -> None:
        self.sh("remove", self._path(area, name))

    def make_dir(self, area: Area, name: str, *, replace: bool = False) -> None:
        """mkdir; `replace`: remove a file there first, in the same node command."""
        script = "replace-dir" if replace else "mkdir"
        if self.sh(script, self._path(area, name), ok=(0, EXISTS)).rc == EXISTS:
            raise FileExistsError(self._path(area, name))

    def remove_dir(self, area: Area, name: str) -> None:
        self.sh("rmdir", self._path(area, name))

    def list_files(self, area: Area) -> list[str]:
        return sorted(self.sh("list", self.dirs[area]).stdout.decode().split())

    def make_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        self.sh("mknod", self._path(area, name), str(major), str(minor))

    def replace_char_device(self, area: Area, name: str, major: int, minor: int) -> None:
        self.sh("replace-char", self._path(area, name), str(major), str(minor))

    def device_metadata(self, path: str) -> dict[str, int | str]:
        """What the two-phase check compares, as hvconform.targets.host.hostfiles reports it."""
        info = self.stat_path(path)
        if info is None:
            return {"type": "missing"}
        return {
            "type": info.kind,
            "major": info.rdev_major,
            "minor": info.rdev_minor,
            "mode": info.mode,
            "uid": info.uid,
            "gid": info.gid,
        }
