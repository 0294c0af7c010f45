"""In-container faults for a plugin image with no shell and no mount tools, by system calls.

A plugin image that holds one static binary cannot run `sh -c 'mount ...'` in its own file
system, yet the faults the checks need are only mounts in the container's mount namespace. A
system call needs no binary there: python3 on the node (or in the diagnostic pod, hostPID and
privileged, when the node has none) opens /proc/<pid>/ns/mnt of the plugin's process, enters it
with setns(2) (python is loaded by then) and calls mount(2), umount2(2) and mknod(2) on the
container's own paths. The operations are those of hvconform.targets.cluster.inside.SCRIPTS,
one for one, so a check cannot tell which way its fault was made.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from hvconform.targets.cluster.access import NodeAccess, NodeAccessError
from hvconform.targets.cluster.guests import CRICTL_SNIPPET
from hvconform.targets.cluster.kube import ExecResult

PID = CRICTL_SNIPPET + "$c inspect --output go-template --template '{{.info.pid}}' \"$1\""

# argv: PID NODEROOT OP ARGS...; exit 0, or 1 with one line on stderr. NODEROOT: the node's root
# as this process reaches it (/proc/1/root on the node or in the hostPID diagnostic pod; the
# kind node container's /proc/<pid>/root from this machine). Single-threaded on purpose:
# setns(CLONE_NEWNS) refuses a process with threads.
SCRIPT = r"""
import ctypes, os, stat, sys
libc = ctypes.CDLL(None, use_errno=True)
def ok(rc, what):
    if rc != 0:
        sys.exit(f"{what}: {os.strerror(ctypes.get_errno())}")
def mount(source, target, fstype, flags, data):
    ok(libc.mount(source.encode(), target.encode(), fstype and fstype.encode(), flags,
                  data and data.encode()), "mount " + target)
def umount(target):
    ok(libc.umount2(target.encode(), 2), "umount " + target)  # MNT_DETACH, as umount -l
def one_line(kind, exc, tb):  # an error is one line on stderr, never a traceback
    sys.stderr.write("%s: %s\n" % (kind.__name__, exc))
    sys.exit(1)
sys.excepthook = one_line
pid, node_root, op, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
node_dev = None
if op in ("device-absent", "device-present"):  # the node's own dir of the device, from here
    node_dev = os.stat(node_root + os.path.dirname(args[0]))
fd = os.open("/proc/%s/ns/mnt" % pid, os.O_RDONLY)
ok(libc.setns(fd, 0x00020000), "setns into the mount namespace of pid " + pid)
os.umask(0)
TMPFS = "size=64k,mode=0755"
if op == "empty":
    mount("hvconform-empty", args[0], "tmpfs", 0, TMPFS)
elif op == "ro-empty":
    mount("hvconform-ro", args[0], "tmpfs", 1, TMPFS)  # MS_RDONLY
elif op == "undo":
    umount(args[0])
elif op == "unusable":
    mount("hvconform-view", args[0], "tmpfs", 0, TMPFS)
    os.mknod(os.path.join(args[0], args[1]), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    mount("/dev/null", args[2], None, 4096, None)  # MS_BIND
elif op == "usable":
    libc.umount2(args[2].encode(), 2)  # as `umount -l "$3";`: either may be gone already
    umount(args[0])
elif op in ("device-absent", "device-present"):
    # The device a plugin mounts itself (hostPath CharDevice at /dev/kvm) taken out of its
    # view and put back, in its own /dev only: the bind is kept at a hidden stash on the same
    # tmpfs, what was under it renamed aside, both reversed by device-present. Never where the
    # container's /dev is the node's (a rename there would change the node for everyone).
    path = args[0]
    parent = os.path.dirname(path)
    here = os.stat(parent)
    if (here.st_dev, here.st_ino) == (node_dev.st_dev, node_dev.st_ino):
        sys.exit("the plugin's %s is the node's own: refused" % parent)
    stash = os.path.join(parent, ".hvconform-" + os.path.basename(path))
    under = stash + "-under"
    if op == "device-absent":
        if os.path.lexists(stash):
            sys.exit("%s is absent already (%s exists)" % (path, stash))
        os.close(os.open(stash, os.O_CREAT | os.O_WRONLY, 0o600))
        mount(path, stash, None, 4096, None)  # MS_BIND: the plugin's device, kept
        umount(path)
        if os.path.lexists(path):  # the runtime's own node or mount point, renamed aside
            os.rename(path, under)
    else:
        if not os.path.lexists(stash):
            sys.exit("%s was not taken away (no %s)" % (path, stash))
        if os.path.lexists(under):
            os.rename(under, path)
        elif not os.path.lexists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        mount(stash, path, None, 4096, None)
        umount(stash)
        os.unlink(stash)
elif op != "probe":
    sys.exit("unknown operation " + op)
"""


class SetnsFaults:
    """The faults of one plugin container made through setns(2), by python3 on the node or in
    the diagnostic pod (probe() chooses and says why neither works)."""

    def __init__(self, access: NodeAccess) -> None:
        self.access = access
        self._python: Callable[[list[str]], ExecResult] | None = None
        self._where = ""
        self._node_root = ""  # the node's root as the chosen python reaches it ("": its own)
        self._local: LocalKindNode | None = None  # kind: this machine's python, host pids

    def _pid(self, container: str) -> str:
        got = self.access.run(["sh", "-c", PID, "sh", container])
        pid = got.stdout.decode(errors="replace").strip()
        if got.rc != 0 or not pid.isdigit() or pid == "0":
            raise NodeAccessError(
                f"no process for plugin container {container[:12]}: "
                f"{got.stderr.decode(errors='replace').strip()[-200:]}"
            )
        return pid

    def _choose(self) -> str:
        """A python3 with ctypes: the node's, else the diagnostic pod's; '' or why neither."""
        check = ["python3", "-c", "import ctypes"]
        if self.access.run(check).rc == 0:
            self._python, self._where = (lambda argv: self.access.run(argv)), "the node"
            return ""
        in_pod = getattr(self.access, "run_in_pod", None)
        if in_pod is not None and in_pod(check).rc == 0:
            self._python, self._where = in_pod, "the diagnostic pod"
            self._node_root = "/proc/1/root"  # hostPID: the node's init
            return ""
        node_pid = getattr(self.access, "node_pid", None)
        if node_pid is not None and (pid := node_pid()) is not None:
            # a kind node is a container of this machine: its processes are this machine's
            self._local = LocalKindNode(pid)
            self._python, self._where = _run_here, "this machine (the kind node's host)"
            self._node_root = f"/proc/{pid}/root"
            return ""
        return f"no python3 on {self.access.where} (nor in a diagnostic pod) to enter it by setns"

    def probe(self, container: str) -> str:
        """'' when the container's mount namespace can be entered, else why not (one line)."""
        why = self._choose()
        if why:
            return why
        try:
            self.run(container, "probe")
        except NodeAccessError as exc:
            return f"setns from {self._where} failed: {exc}"
        return ""

    def run(self, container: str, name: str, *args: str) -> None:
        if self._python is None:
            raise NodeAccessError("SetnsFaults.run before a successful probe")
        pid = self._pid(container)
        if self._local is not None:
            pid = str(self._local.host_pid(int(pid)))
        result = self._python(["python3", "-c", SCRIPT, pid, self._node_root, name, *args])
        if result.rc != 0:
            raise NodeAccessError(
                f"inside plugin container {container[:12]} (setns from {self._where}): {name} "
                f"{' '.join(args)} exited {result.rc}: "
                f"{result.stderr.decode(errors='replace').strip()[-300:]}"
            )


def _run_here(argv: list[str]) -> ExecResult:
    """argv on this machine, python3 being this interpreter (the suite's own)."""
    if argv and argv[0] == "python3":
        argv = [sys.executable, *argv[1:]]
    done = subprocess.run(argv, capture_output=True, timeout=60, check=False)
    return ExecResult(done.returncode, done.stdout, done.stderr)


class LocalKindNode:
    """A kind node container of this machine: a pid as the node's runtime reports it (its pid
    namespace) turned into this machine's pid, among the node container's descendants."""

    def __init__(self, node_init: int) -> None:
        self.node_init = node_init  # the node container's init, as this machine sees it

    def _descends(self, pid: int) -> bool:
        for _ in range(64):  # a bounded walk up the parents
            if pid == self.node_init:
                return True
            if pid <= 1:
                return False
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                return False
            pid = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")))
        return False

    def host_pid(self, node_pid: int) -> int:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue  # gone meanwhile
            nspid = next(
                (ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")), []
            )
            if len(nspid) >= 2 and nspid[1] == str(node_pid) and self._descends(int(entry.name)):
                return int(entry.name)
        raise NodeAccessError(f"no process of this machine is pid {node_pid} of the kind node")
