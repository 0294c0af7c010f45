"""A named network namespace joined to the root namespace by a veth pair (pyroute2).

Index i (0..255) names everything: host link `hvh<i>` with 10.231.<i>.1/30 in the root namespace,
peer `hvp<i>` with 10.231.<i>.2/30 inside the namespace (lo up there too). Link names and
addresses are machine-wide, so an index must be unique among everything running on the machine
at once: per run and per pytest-xdist worker. The caller chooses it; `worker_index(slot)` gives
worker gwN its own block (base + N * per_worker + slot), and `free_index` skips indices whose host
link exists. Creating the veth pair is the claim: when `hvh<i>` already exists the constructor
raises IndexInUseError and touches nothing of the other owner's. Namespace names should carry
the creating pid too (the sandbox uses `hvsbx<i>-<pid>`).

/run/netns is made a shared mount point by pyroute2 (as `ip netns add` does) and is shared by
every namespace user. What this module makes of it is marked with xattrs (the directory; the
mount, when the directory was there but not a mount point) and recorded; what it did not make
is never removed nor unmounted: a /run/netns (dir or mount) that existed before is left exactly
as it was.

Who removes what it made: in a run (hvconform's pytest session) the run itself, never a worker.
The controller, which verifies the run's cleanup, is the run-level owner (RunOwner): its id goes
to every pytest-xdist worker (OWNER_ENV); a worker making or finding an hvconform /run/netns
registers that id on it (xattr, under the /run lock) and only uses it; the owner releases it
once every worker has ended, in whatever order they ended (a worker's namespace left by a crash
is removed then). A /run/netns that another live run has registered stays for that run's owner.
Without an owner (a process on its own, a unit test) the last NetNamespace to close removes it,
unless a live run has it registered.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import TracebackType

from pyroute2 import IPRoute, NetlinkError, netns

from hvconform.contract.ledger import (
    SHARED_OWNERS_XATTR,
    Entry,
    Ledger,
    live_shared_owners,
    process_ident,
)

RUN_DIR = Path("/run/netns")
_MARK = "user.hv_conformance"  # on /run/netns: the directory is hvconform's
_MOUNT_MARK = "user.hv_conformance.mount"  # the mount at /run/netns is hvconform's
MAX_INDEX = 255
SHARED = "shared; removed by the last user"  # ledger detail of /run/netns entries, no owner
SHARED_RUN = "shared; released by the run's owner"  # ... made under a run-level owner
OWNER_ENV = "HV_NETNS_OWNER"  # the run-level owner's process ident (pid:start), for the workers
RELEASE_TIMEOUT_S = 10.0  # how long the owner retries an unmount that is busy


class NetnsError(RuntimeError):
    """Creating or removing a namespace or its links failed, or something survived close()."""


class IndexInUseError(NetnsError):
    """The host link of this index exists: another sandbox (maybe another run) holds it."""


def worker_index(slot: int, *, base: int = 64, per_worker: int = 16) -> int:
    """Index of `slot` for this pytest-xdist worker (PYTEST_XDIST_WORKER=gwN; none = gw0)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    number = int(worker.removeprefix("gw") or "0")
    if not 0 <= slot < per_worker:
        raise ValueError(f"slot {slot} outside 0..{per_worker - 1}")
    index = base + number * per_worker + slot
    if not 0 <= index <= MAX_INDEX:
        raise ValueError(f"index {index} for worker {worker} slot {slot} exceeds {MAX_INDEX}")
    return index


def host_link(index: int) -> str:
    """Root-namespace end of the veth pair of `index`."""
    return f"hvh{index}"


def free_index(candidates: Iterable[int]) -> int:
    """First candidate whose host link does not exist (a hint: creation is the real claim)."""
    for index in candidates:
        if not Path("/sys/class/net", host_link(index)).exists():
            return index
    raise IndexInUseError("every candidate index has a host link already")


def is_mount_point(path: Path) -> bool:
    """From mountinfo: os.path.ismount misses a directory bind-mounted onto itself."""
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        return any(line.split()[4].replace("\\040", " ") == str(path) for line in fh)


def _umount(path: Path) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    # Not lazy: EBUSY while another owner's namespace is mounted inside is the safe answer.
    return 0 if libc.umount2(str(path).encode(), 0) == 0 else ctypes.get_errno()


@contextlib.contextmanager
def _run_dir_lock() -> Iterator[None]:
    # Serialises making and removing /run/netns between our processes (xdist workers): without
    # it a worker could remove the directory between another's mkdir and its namespace file.
    # The lock is on /run itself, so it leaves no file behind.
    fd = os.open(RUN_DIR.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def run_dir_shared() -> bool:
    """/run/netns holds namespaces (someone else's, once ours are closed): it must stay."""
    return RUN_DIR.is_dir() and any(RUN_DIR.iterdir())


def run_owner() -> str:
    """The run-level owner this process works for ('' for none: it cleans up itself)."""
    return os.environ.get(OWNER_ENV, "")


def _has(name: str) -> bool:
    try:
        os.getxattr(RUN_DIR, name)
    except OSError:
        return False  # absent (or xattrs unsupported: then nothing is ours either)
    return True


def _set_owners(owners: list[str]) -> None:
    if owners:
        os.setxattr(RUN_DIR, SHARED_OWNERS_XATTR, " ".join(owners).encode())
    elif _has(SHARED_OWNERS_XATTR):
        os.removexattr(RUN_DIR, SHARED_OWNERS_XATTR)


def _prepare_run_dir(ledger: Ledger) -> None:
    """Under the lock: /run/netns made (marked, recorded) where missing, and this process's
    run-level owner registered on what of it is hvconform's."""
    owner = run_owner()
    detail = SHARED_RUN if owner else SHARED
    if not RUN_DIR.exists():
        ledger.record("dir", str(RUN_DIR), detail)
        RUN_DIR.mkdir(mode=0o755)
        os.setxattr(RUN_DIR, _MARK, b"1")
    if not is_mount_point(RUN_DIR):  # pyroute2 binds it onto itself: that mount is ours
        ledger.record("mount", str(RUN_DIR), detail)
        os.setxattr(RUN_DIR, _MOUNT_MARK, b"1")
    if owner and (_has(_MARK) or _has(_MOUNT_MARK)):
        owners = live_shared_owners(RUN_DIR)
        if owner not in owners:
            _set_owners([*owners, owner])


def add_namespace(name: str, ledger: Ledger) -> None:
    """Create the named network namespace /run/netns/NAME (recorded), /run/netns with it when
    missing. Serialised with every release (the /run lock)."""
    with _run_dir_lock():
        _prepare_run_dir(ledger)
        ledger.record("netns", name)
        netns.create(name)


def remove_namespace(name: str) -> None:
    """Remove /run/netns/NAME; without a run-level owner, /run/netns too when it is the last
    user (with one, the owner releases it after the run)."""
    if os.path.lexists(RUN_DIR / name):
        netns.remove(name)
    if not run_owner():
        release_run_dir()


def release_run_dir(owner: str = "") -> bool:
    """What hvconform made of /run/netns removed when nobody uses it: unregister `owner`; if no
    live owner is left and no namespace is inside, unmount the mount it made and remove the
    directory it made (a pre-existing directory keeps everything but our marks). True when
    /run/netns is as it was before hvconform, or stays because someone else still uses it."""
    with _run_dir_lock():
        return _release_run_dir(owner) != "busy"


def release_stale_run_dir() -> bool:
    """Release an hvconform /run/netns nobody uses any more (no namespace inside, no live
    owner registered): what a run killed before its owner's release left behind. Under the
    lock, so a process between making /run/netns and its namespace is never caught in between.
    True when there was one and it was released."""
    with _run_dir_lock():
        if not RUN_DIR.exists() or not (_has(_MARK) or _has(_MOUNT_MARK)):
            return False
        if live_shared_owners(RUN_DIR) or any(RUN_DIR.iterdir()):
            return False
        return _release_run_dir("") == "released"


def _release_run_dir(owner: str) -> str:
    """'released', 'in use', 'not ours' or 'busy' (an unmount refused: retried by the owner)."""
    if not RUN_DIR.exists():
        return "released"
    made_dir, made_mount = _has(_MARK), _has(_MOUNT_MARK)
    if not (made_dir or made_mount):
        return "not ours"
    owners = live_shared_owners(RUN_DIR)
    _set_owners([o for o in owners if o != owner])  # the dead ones dropped too
    if [o for o in owners if o != owner] or any(RUN_DIR.iterdir()):
        return "in use"
    for _ in range(8):  # mounts may be stacked (a pre-existing directory: only ours above it)
        if not is_mount_point(RUN_DIR):
            break
        if _umount(RUN_DIR) != 0:
            return "busy"
    if not made_dir:  # the directory was there before: it keeps its place, minus our mark
        with contextlib.suppress(OSError):
            os.removexattr(RUN_DIR, _MOUNT_MARK)
        return "released"
    try:
        RUN_DIR.rmdir()
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EBUSY, errno.ENOENT):
            raise
    return "released" if not RUN_DIR.exists() else "busy"


class RunOwner:
    """The run-level owner of /run/netns: the process that outlives every worker of the run and
    verifies its cleanup (the pytest controller, or the single pytest process).

    `start()` before any worker starts: its id is exported to them (OWNER_ENV), so what a worker
    makes of /run/netns is registered under the run, not under the worker. `release(entries)`
    once every worker has ended: the namespaces the run's ledger lists that are still there (a
    worker that crashed before closing them) are removed, then /run/netns as release_run_dir
    says, an unmount that is busy retried until RELEASE_TIMEOUT_S. Returns what was left."""

    def __init__(self) -> None:
        self.ident = process_ident(os.getpid())

    def start(self) -> bool:
        """Export the owner's id; first adopt and release what a dead run left of /run/netns
        (its owner SIGKILLed before releasing: ours, empty, no live owner). True when there
        was such a leftover and it is gone now."""
        os.environ[OWNER_ENV] = self.ident
        return release_stale_run_dir()

    def release(self, entries: Iterable[Entry], timeout_s: float = RELEASE_TIMEOUT_S) -> list[str]:
        if os.environ.get(OWNER_ENV) == self.ident:
            del os.environ[OWNER_ENV]
        left = []
        for entry in entries:
            if entry.kind == "netns" and os.path.lexists(RUN_DIR / entry.ident):
                try:
                    netns.remove(entry.ident)
                except OSError as exc:
                    left.append(f"netns {entry.ident}: {exc.strerror}")
        deadline = time.monotonic() + timeout_s
        while True:
            with _run_dir_lock():
                outcome = _release_run_dir(self.ident)
            if outcome != "busy":
                return left
            if time.monotonic() >= deadline:
                return [*left, f"mount {RUN_DIR}: busy for {timeout_s:g}s"]
            time.sleep(0.05)  # polling a condition with a deadline: the unmount succeeding


class NetNamespace:
    """Create `name` with a veth pair to the root namespace; close() removes both, verified."""

    def __init__(self, name: str, index: int, ledger: Ledger) -> None:
        if not 0 <= index <= MAX_INDEX:
            raise ValueError(f"index {index} outside 0..{MAX_INDEX}")
        if "/" in name or not name or len(name) > 64:
            raise ValueError(f"invalid namespace name {name!r}")
        self.name = name
        self.index = index
        self.ledger = ledger
        self.host_link = host_link(index)
        self.peer_link = f"hvp{index}"
        self.host_addr = f"10.231.{index}.1"
        self.ns_addr = f"10.231.{index}.2"
        self.path = RUN_DIR / name
        self._closed = False
        self._own_link = False  # never delete a link another owner holds (IndexInUseError)
        if self.path.exists():
            raise NetnsError(f"network namespace {name} exists already")
        try:
            self._create()
        except BaseException:
            self.close()
            raise

    def _create(self) -> None:
        add_namespace(self.name, self.ledger)
        with IPRoute() as ipr:
            try:
                ipr.link(
                    "add",
                    ifname=self.host_link,
                    kind="veth",
                    peer={"ifname": self.peer_link, "net_ns_fd": self.name},
                )
            except NetlinkError as exc:
                if exc.code == errno.EEXIST:
                    raise IndexInUseError(
                        f"index {self.index}: link {self.host_link} exists (another sandbox?)"
                    ) from exc
                raise NetnsError(f"create veth {self.host_link}: {exc}") from exc
            self._own_link = True
            self.ledger.record("link", self.host_link, f"veth peer {self.peer_link} in {self.name}")
            (idx,) = ipr.link_lookup(ifname=self.host_link)
            ipr.addr("add", index=idx, address=self.host_addr, prefixlen=30)
            ipr.link("set", index=idx, state="up")
        with IPRoute(netns=self.name) as ns:
            (peer,) = ns.link_lookup(ifname=self.peer_link)
            ns.addr("add", index=peer, address=self.ns_addr, prefixlen=30)
            ns.link("set", index=peer, state="up")
            (lo,) = ns.link_lookup(ifname="lo")
            ns.link("set", index=lo, state="up")

    def links_inside(self) -> dict[str, list[str]]:
        """Link name -> IPv4 addresses, as seen inside the namespace."""
        out: dict[str, list[str]] = {}
        with IPRoute(netns=self.name) as ns:
            names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ns.get_links()}
            for name in names.values():
                out[name] = []
            for addr in ns.get_addr(family=2):
                out[names[addr["index"]]].append(addr.get_attr("IFA_ADDRESS"))
        return out

    def leftovers(self) -> list[str]:
        """What of this namespace still exists on the machine."""
        left = []
        if self._own_link and Path("/sys/class/net", self.host_link).exists():
            left.append(f"link {self.host_link}")
        if self.path.exists() or os.path.lexists(self.path):
            left.append(f"netns {self.path}")
        return left

    def close(self) -> None:
        """Delete the veth pair and the namespace, then verify both are gone. Idempotent."""
        if self._closed:
            return
        errors: list[str] = []
        if self._own_link and Path("/sys/class/net", self.host_link).exists():
            try:
                with IPRoute() as ipr:
                    ipr.link("del", ifname=self.host_link)  # takes the peer with it
            except NetlinkError as exc:
                errors.append(f"delete {self.host_link}: {exc}")
        try:
            remove_namespace(self.name)
        except OSError as exc:
            errors.append(f"remove netns {self.name}: {exc}")
        left = self.leftovers()
        self._closed = not left
        if errors or left:
            raise NetnsError(f"netns {self.name} teardown: {'; '.join(errors + left)}")

    def __enter__(self) -> NetNamespace:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
