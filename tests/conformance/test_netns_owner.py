"""/run/netns has a run-level owner (issue 34): what pytest-xdist workers share on the host is
released by the run once every worker has ended, in whatever order they end, never by a worker
and never while one still uses it; a /run/netns that existed before is left as it was.

Everything runs for real in a private mount namespace with a tmpfs of its own at /run (made by
`unshare --mount`), so the host's /run/netns is never touched: the owner and the workers are
processes entered into it (`nsenter --mount`), each making real network namespaces through the
module the suite uses; the test reads the namespace's mount table from outside
(/proc/<holder>/mountinfo) after each step.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hvconform.contract.ledger import SHARED_OWNERS_XATTR
from tests.conformance.process_guard import no_leftover_processes  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30.0
OURS = "user.hv_conformance"  # every xattr this suite puts on /run/netns starts so
pytestmark = [pytest.mark.root]

# The holder of the private mount namespace: /run is a tmpfs of its own there; `pre` makes a
# /run/netns that exists before the run (a plain directory, or one bind-mounted onto itself
# and shared, as `ip netns add` leaves it). It lives until its stdin closes.
HOLDER = r"""
import os, subprocess, sys
def sh(*argv): subprocess.run(argv, check=True)
def at_netns():
    with open("/proc/self/mountinfo") as f:
        return [ln for ln in f if ln.split()[4] == "/run/netns"]
# A /run/netns the host has mounted when this namespace was made (another run using it, as in
# CI where suites run beside this test) is copied in: detach the copies first, here only (the
# namespace is private), so the tmpfs below starts with no /run/netns mount at all.
while at_netns():
    sh("umount", "-l", "/run/netns")
sh("mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "hv-netns-test", "/run")
pre = sys.argv[1]
if pre != "none":
    os.mkdir("/run/netns", 0o755)
if pre == "mount":
    sh("mount", "--bind", "/run/netns", "/run/netns")
    sh("mount", "--make-shared", "/run/netns")
print("ready", flush=True)
sys.stdin.read()
"""


def role(argv: list[str]) -> None:
    """A process of the run inside the namespace: `owner LEDGER_DIR` (the controller) or
    `worker NAME LEDGER` (an xdist worker using /run/netns for one network namespace)."""
    from hvconform.contract.ledger import Ledger, read_entries
    from hvconform.targets.host import netns

    if argv[0] == "owner":
        owner = netns.RunOwner()
        owner.start()
        print(owner.ident, flush=True)
        for line in sys.stdin:
            if line.strip() == "release":
                entries = read_entries(sorted(Path(argv[1]).glob("*.jsonl")))
                print(json.dumps(owner.release(entries)), flush=True)
        return
    name, ledger = argv[1], Path(argv[2])
    netns.add_namespace(name, Ledger(ledger, owner=ledger.stem))
    print("using", flush=True)
    for line in sys.stdin:
        if line.strip() == "end":
            netns.remove_namespace(name)
            print("ended", flush=True)
            return


class Proc:
    """A child with a line protocol on stdin/stdout, every read bounded by a deadline."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd=REPO, env=env,
        )  # fmt: skip
        self._buf = b""

    def line(self, timeout: float = TIMEOUT_S) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(left, 0))
            chunk = os.read(fd, 4096) if ready else b""
            if not chunk:
                self.proc.kill()
                _, err = self.proc.communicate(timeout=TIMEOUT_S)
                raise AssertionError(f"no line from {self.proc.args!r}: {err.decode()[-2000:]}")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def ended(self) -> int:
        """Its exit status once its stdin is closed (it ends by itself then)."""
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(TIMEOUT_S)
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()


class Namespace:
    """The private mount namespace (its holder) and the processes of one or two runs in it."""

    def __init__(self, pre: str, ledgers: Path) -> None:
        argv = ["unshare", "--mount", "--propagation", "private", "--",
                sys.executable, "-c", HOLDER, pre]  # fmt: skip
        self.holder = Proc(argv)
        assert self.holder.line() == "ready"
        self.pid = self.holder.proc.pid
        self.ledgers = ledgers
        self.procs: list[Proc] = []
        self.owners: list[str] = []  # the run owners made in here (their ids)

    def _enter(self, args: list[str], env: dict[str, str]) -> Proc:
        code = "import sys; from tests.conformance.test_netns_owner import role; role(sys.argv[1:])"
        argv = ["nsenter", f"--target={self.pid}", "--mount", "--",
                sys.executable, "-c", code, *args]  # fmt: skip
        proc = Proc(argv, env={**env, "PYTHONPATH": str(REPO)})
        self.procs.append(proc)
        return proc

    def owner(self, run: str) -> tuple[Proc, str]:
        proc = self._enter(["owner", str(self.ledgers / run)], _env())
        ident = proc.line()
        self.owners.append(ident)
        return proc, ident

    def worker(self, run: str, name: str, owner: str | None) -> Proc:
        env = _env() if owner is None else {**_env(), "HV_NETNS_OWNER": owner}
        (self.ledgers / run).mkdir(exist_ok=True)
        proc = self._enter(["worker", name, str(self.ledgers / run / f"{name}.jsonl")], env)
        assert proc.line() == "using"
        return proc

    def end(self, worker: Proc) -> None:
        worker.send("end")
        assert worker.line() == "ended"
        assert worker.ended() == 0

    def release(self, owner: Proc) -> list[str]:
        owner.send("release")
        left: list[str] = json.loads(owner.line())
        return left

    # -- what the namespace holds, read from outside -------------------------------------------

    @property
    def run_netns(self) -> Path:
        return Path(f"/proc/{self.pid}/root/run/netns")

    def mounts(self) -> list[str]:
        """Mount ids at /run/netns, bottom first."""
        lines = Path(f"/proc/{self.pid}/mountinfo").read_text().splitlines()
        return [ln.split()[0] for ln in lines if ln.split()[4] == "/run/netns"]

    def marks(self) -> list[str]:
        return sorted(x for x in os.listxattr(self.run_netns) if x.startswith(OURS))

    def close(self) -> None:
        for proc in self.procs:
            if proc.proc.poll() is None:
                proc.proc.kill()
            proc.ended()
        assert self.holder.ended() == 0


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "HV_NETNS_OWNER"}


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Callable[[str], Namespace]]:
    made: list[Namespace] = []

    def make(pre: str = "none") -> Namespace:
        (tmp_path / "ledgers").mkdir(exist_ok=True)
        space = Namespace(pre, tmp_path / "ledgers")
        made.append(space)
        return space

    yield make
    for space in made:
        space.close()
    # the host's own /run/netns was never the one used: none of this test's owners is on it
    # (real runs beside this test may register theirs there: those are not this test's)
    if Path("/run/netns").exists() and SHARED_OWNERS_XATTR in os.listxattr("/run/netns"):
        host = os.getxattr("/run/netns", SHARED_OWNERS_XATTR).decode().split()
        assert not {o for space in made for o in space.owners} & set(host), host


@pytest.mark.parametrize("order", ["A then B", "B then A"])
def test_the_run_releases_it_after_both_workers_whatever_their_order(
    private: Callable[[str], Namespace], order: str
) -> None:
    space = private("none")
    owner, ident = space.owner("run")
    a = space.worker("run", "hvt-a", ident)
    b = space.worker("run", "hvt-b", ident)
    made = space.mounts()
    assert len(made) == 1 and space.marks() == sorted([OURS, f"{OURS}.mount", SHARED_OWNERS_XATTR])
    first, second = (a, b) if order == "A then B" else (b, a)
    space.end(first)
    assert space.mounts() == made, "removed while a worker still uses it"
    space.end(second)
    assert space.mounts() == made and space.run_netns.is_dir(), "a worker removed the run's"
    assert space.release(owner) == []
    assert space.mounts() == [] and not space.run_netns.exists()


def test_a_worker_killed_while_the_other_uses_it(private: Callable[[str], Namespace]) -> None:
    space = private("none")
    owner, ident = space.owner("run")
    a = space.worker("run", "hvt-a", ident)
    b = space.worker("run", "hvt-b", ident)
    made = space.mounts()
    a.proc.send_signal(signal.SIGKILL)
    assert a.ended() == -signal.SIGKILL
    assert space.mounts() == made and (space.run_netns / "hvt-b").exists()
    space.end(b)
    assert space.mounts() == made, "gone before its owner released it"
    assert sorted(p.name for p in space.run_netns.iterdir()) == ["hvt-a"]  # the crash's
    assert space.release(owner) == []  # the run removes its crashed worker's namespace too
    assert space.mounts() == [] and not space.run_netns.exists()


@pytest.mark.parametrize("pre", ["mount", "dir"])
def test_a_run_netns_that_existed_is_left_as_it_was(
    private: Callable[[str], Namespace], pre: str
) -> None:
    space = private(pre)
    before = space.mounts()
    assert len(before) == (1 if pre == "mount" else 0)
    owner, ident = space.owner("run")
    a = space.worker("run", "hvt-a", ident)
    b = space.worker("run", "hvt-b", ident)
    assert space.mounts()[: len(before)] == before
    space.end(b)
    space.end(a)
    assert space.release(owner) == []
    assert space.mounts() == before, "a pre-existing mount unmounted, or ours left on it"
    assert space.run_netns.is_dir() and not any(space.run_netns.iterdir())
    assert space.marks() == [], "our marks left on a directory that was not ours"


def test_another_runs_registration_keeps_it_until_that_run_releases(
    private: Callable[[str], Namespace],
) -> None:
    space = private("none")
    owner_x, x = space.owner("x")
    owner_y, y = space.owner("y")
    wx = space.worker("x", "hvt-x", x)
    wy = space.worker("y", "hvt-y", y)
    made = space.mounts()
    space.end(wx)
    assert space.release(owner_x) == []
    assert space.mounts() == made, "run x removed what run y still uses"
    space.end(wy)
    assert space.mounts() == made, "nobody but run y's owner may release it now"
    owner_y.proc.send_signal(signal.SIGKILL)  # a dead owner holds nothing
    assert owner_y.ended() == -signal.SIGKILL
    owner_z, _ = space.owner("z")
    assert space.release(owner_z) == []
    assert space.mounts() == [] and not space.run_netns.exists()


def test_without_an_owner_the_last_user_removes_it(private: Callable[[str], Namespace]) -> None:
    space = private("none")
    a = space.worker("solo", "hvt-a", None)
    b = space.worker("solo", "hvt-b", None)
    made = space.mounts()
    space.end(a)
    assert space.mounts() == made
    space.end(b)
    assert space.mounts() == [] and not space.run_netns.exists()


def test_the_next_run_releases_what_a_killed_run_left(private: Callable[[str], Namespace]) -> None:
    # The leftover both CI rehearsals of stop 40 found on the host: a run's owner killed after
    # its worker closed its namespace and before it released /run/netns (empty, ours, its
    # owner dead). Nobody else would ever release it: the next run's owner does, at its start.
    space = private("none")
    dead, ident = space.owner("dead")
    space.end(space.worker("dead", "hvt-a", ident))
    dead.proc.send_signal(signal.SIGKILL)
    assert dead.ended() == -signal.SIGKILL
    left = space.mounts()
    assert len(left) == 1 and f"{OURS}.mount" in space.marks(), "the leftover was not made"
    space.owner("next")
    assert space.mounts() == [] and not space.run_netns.exists(), "the next run kept it"


def test_the_next_run_keeps_one_a_live_run_uses(private: Callable[[str], Namespace]) -> None:
    space = private("none")
    _, ident = space.owner("live")
    worker = space.worker("live", "hvt-a", ident)
    made = space.mounts()
    space.owner("next")
    assert space.mounts() == made and (space.run_netns / "hvt-a").exists()
    space.end(worker)
