"""In-container faults for a plugin image with no shell and no mount tools, by system calls.

A plugin image that holds one static binary cannot run `sh -c 'mount ...'` in its own file
system, yet the faults the checks need are only mounts in the container's mount namespace. A
system call needs no binary there: python3 on the node (or in the diagnostic pod, hostPID and
privileged, when the node has none) opens /proc/<pid>/ns/mnt of the plugin's process, enters it
with setns(2) (python is loaded by then) and calls mount(2), umount2(2) and mknod(2) on the
container's own paths. The operations are those of conformance.targets.cluster.inside.SCRIPTS,
one for one, so a check cannot tell which way its fault was made.
"""

from __future__ import annotations

from collections.abc import Callable

from conformance.targets.cluster.access import NodeAccess, NodeAccessError
from conformance.targets.cluster.guests import CRICTL_SNIPPET
from conformance.targets.cluster.kube import ExecResult

PID = CRICTL_SNIPPET + "$c inspect --output go-template --template '{{.info.pid}}' \"$1\""

# argv: PID OP ARGS...; exit 0, or 1 with one line on stderr. Single-threaded on purpose:
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
pid, op, args = sys.argv[1], sys.argv[2], sys.argv[3:]
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
        result = self._python(["python3", "-c", SCRIPT, self._pid(container), name, *args])
        if result.rc != 0:
            raise NodeAccessError(
                f"inside plugin container {container[:12]} (setns from {self._where}): {name} "
                f"{' '.join(args)} exited {result.rc}: "
                f"{result.stderr.decode(errors='replace').strip()[-300:]}"
            )
