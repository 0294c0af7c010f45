"""A container runtime, emulated for the local target: CDI edits applied the way runtimes do.

`run_workload` / `start_workload`:
1. Resolve every CDI name with the CDI cache rules (hvconform.guest.cdi_resolve). An unresolvable
   name raises UnresolvableCDIDevice("unresolvable CDI devices <names>") before anything starts,
   as container creation fails.
2. Through the launcher: a fresh network namespace with only lo (`--network none`), a private
   mount namespace, and a /dev that is a fresh tmpfs holding only null, zero, urandom and the
   resolved device nodes. Each node is made with mknod: type/major/minor from the spec or, when
   absent, from lstat of the host path (hostPath, else path), as the CDI library fills them in;
   uid/gid from the spec (absent: 0); mode = fileMode, else from permissions (r 0444, w 0222,
   rw or empty 0666: podman 4.3 made `crw-rw-rw-` for `rw`, see docs cdi.md).
   An Allocate answer's DeviceSpecs (`device_specs`) are made the same way: host_path's type and
   numbers from lstat, at container_path, owner 0, mode from permissions as above ("rw": 0666,
   standing in for the cgroup rule a runtime derives from them; the host's own 0600 root:root
   node, bound as is, would be closed to the unprivileged workload).
3. Environment: PATH and HOME, then the devices' env edits in name order, then the caller's.
4. uid/gid switch with no supplementary groups, every capability set empty and no_new_privs
   (runAsUser, drop ALL, allowPrivilegeEscalation: false), verified, then exec.

The runtime itself drops to uid/gid; it never adds --drop-privileges to argv (`guest_command`
does, through its parameter). argv runs as that uid, so its interpreter and program must be
reachable by it from any checkout (one below a 0700 home, a path with spaces):
`workload_program` stages the guest where uid 65534 can read it and `workload_python()` finds
an interpreter that runs it as that uid.
Divergences from a real runtime: no cgroup device rule (the mode approximates `permissions`),
only deviceNodes and env edits (cdi_resolve exposes no mounts or hooks), the host's filesystem is
the image, and there are no pid/ipc/uts namespaces.
"""

from __future__ import annotations

import functools
import os
import stat
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import IO, Any

from hvconform.contract.ledger import Ledger
from hvconform.contract.node import DeviceSpec
from hvconform.guest.cdi_resolve import CDIRegistry, DeviceNode, ResolvedDevice
from hvconform.guest.privileges import NOBODY
from hvconform.targets.host.launcher import LAUNCHER, NodeSpec
from hvconform.targets.host.procs import read_handshake
from hvconform.targets.local.workload_program import STAGE, Program, choose_python

BASE_DEVS = "null,zero,urandom"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HOST_TYPES = {stat.S_IFCHR: "c", stat.S_IFBLK: "b", stat.S_IFIFO: "p"}

PathArg = str | os.PathLike[str]


class WorkloadStartError(RuntimeError):
    """The workload never ran: device setup, privilege drop or exec failed (code 125/126/127)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"workload not started (exit {code}): {message}")
        self.code = code


def node_mode(node: DeviceNode) -> int:
    """fileMode when given, else what the permissions allow to everyone."""
    if node.file_mode is not None:
        return node.file_mode & 0o7777
    perms = node.permissions or "rw"  # empty means every access in CDI
    return (0o444 if "r" in perms else 0) | (0o222 if "w" in perms else 0)


def node_spec(node: DeviceNode) -> NodeSpec:
    """The node to mknod; missing type or numbers come from lstat of the host path."""
    kind, major, minor = node.type, node.major or 0, node.minor or 0
    if not kind or (major == 0 and kind != "p"):
        host = node.host_path or node.path
        try:
            st = os.lstat(host)
        except OSError as exc:
            raise WorkloadStartError(
                125, f"failed to stat CDI host device {host!r}: {exc.strerror}"
            ) from exc
        host_kind = _HOST_TYPES.get(stat.S_IFMT(st.st_mode))
        if host_kind is None:
            raise WorkloadStartError(125, f"CDI host device {host!r} is not a device node")
        if kind and kind.replace("u", "c") != host_kind:
            raise WorkloadStartError(
                125, f"CDI device {node.path!r}: type {kind!r} but host {host!r} is {host_kind!r}"
            )
        kind = kind or host_kind
        if major == 0 and kind != "p":
            major, minor = os.major(st.st_rdev), os.minor(st.st_rdev)
    uid = 0 if node.uid is None else node.uid
    gid = 0 if node.gid is None else node.gid
    return NodeSpec(node.path, kind, major, minor, node_mode(node), uid, gid)


def device_spec_node(spec: DeviceSpec) -> NodeSpec:
    """The node a runtime makes for one DeviceSpec: the host node's kind and numbers, at
    container_path (a runtime fails container creation when host_path is no device)."""
    try:
        st = os.lstat(spec.host_path)
    except OSError as exc:
        raise WorkloadStartError(
            125, f"failed to stat DeviceSpec host path {spec.host_path!r}: {exc.strerror}"
        ) from exc
    kind = _HOST_TYPES.get(stat.S_IFMT(st.st_mode))
    if kind not in ("c", "b"):
        raise WorkloadStartError(125, f"DeviceSpec host path {spec.host_path!r} is no device node")
    mode = node_mode(DeviceNode(spec.container_path, permissions=spec.permissions))
    return NodeSpec(
        spec.container_path, kind, os.major(st.st_rdev), os.minor(st.st_rdev), mode, 0, 0
    )


def workload_env(
    devices: Sequence[ResolvedDevice], env: Mapping[str, str] | None
) -> dict[str, str]:
    """PATH/HOME, then each device's env edits, then the caller's (later wins)."""
    merged = {"PATH": DEFAULT_PATH, "HOME": "/"}
    for device in devices:
        merged.update(device.env)
    merged.update(env or {})
    return merged


def launcher_argv(
    devices: Sequence[ResolvedDevice],
    argv: Sequence[str],
    *,
    uid: int,
    gid: int,
    network: str = "none",
    exec_fd: int | None = None,
    spec_nodes: Sequence[NodeSpec] = (),
) -> list[str]:
    """The launcher command that runs argv as the runtime would."""
    if network not in ("none", "host"):
        raise ValueError(f"network {network!r}: want 'none' or 'host'")
    cmd = [sys.executable, "-I", str(LAUNCHER), "--private-dev", f"--base-devs={BASE_DEVS}"]
    if network == "none":
        cmd.append("--unshare-net")
    for device in devices:
        cmd += [f"--mknod={node_spec(node).to_arg()}" for node in device.device_nodes]
    cmd += [f"--mknod={node.to_arg()}" for node in spec_nodes]
    cmd += [f"--user={uid}:{gid}", "--drop-caps", "--no-new-privs"]
    if exec_fd is not None:
        cmd.append(f"--exec-fd={exec_fd}")
    return [*cmd, "--", *argv]


def _launch(
    cdi_names: Sequence[str],
    spec_dirs: Sequence[PathArg],
    argv: Sequence[str],
    *,
    uid: int,
    gid: int,
    env: Mapping[str, str] | None,
    network: str,
    ledger: Ledger | None,
    popen_kw: dict[str, Any],
    device_specs: Sequence[DeviceSpec] = (),
) -> subprocess.Popen[Any]:
    # Raises UnresolvableCDIDevice, with exactly the runtime's message, before anything starts.
    devices = CDIRegistry([os.fspath(d) for d in spec_dirs]).resolve_all(list(cdi_names))
    # A CDI edit of the same path replaces the DeviceSpec's node, as CDI injection does in a runtime.
    cdi_paths = {node.path for device in devices for node in device.device_nodes}
    spec_nodes = [device_spec_node(s) for s in device_specs if s.container_path not in cdi_paths]
    read_fd, write_fd = os.pipe()
    try:
        cmd = launcher_argv(
            devices, argv, uid=uid, gid=gid, network=network, exec_fd=write_fd,
            spec_nodes=spec_nodes,
        )  # fmt: skip
        proc: subprocess.Popen[Any] = subprocess.Popen(
            cmd, env=workload_env(devices, env), cwd="/", pass_fds=(write_fd,),
            start_new_session=True, **popen_kw,
        )  # fmt: skip
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    if ledger is not None:
        ledger.record_process(proc.pid, f"workload {argv[0]}")
    try:
        error = read_handshake(read_fd, 30.0, f"workload {argv[0]}")
    except TimeoutError:
        proc.kill()
        proc.communicate()
        raise
    if error:
        proc.communicate()  # the launcher has exited; drain and close its pipes
        code, _, message = error.partition(":")
        raise WorkloadStartError(int(code) if code.isdigit() else 125, message)
    return proc


def run_workload(
    cdi_names: Sequence[str],
    spec_dirs: Sequence[PathArg],
    argv: Sequence[str],
    *,
    uid: int = NOBODY,
    gid: int = NOBODY,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    network: str = "none",
    ledger: Ledger | None = None,
    device_specs: Sequence[DeviceSpec] = (),
) -> subprocess.CompletedProcess[str]:
    """Run argv to completion in a container-like sandbox; output captured as text.

    Raises UnresolvableCDIDevice, WorkloadStartError (argv never ran) or TimeoutExpired (the
    workload was killed).
    """
    proc = _launch(
        cdi_names, spec_dirs, argv, uid=uid, gid=gid, env=env, network=network, ledger=ledger,
        device_specs=device_specs,
        popen_kw={"stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE,
                  "stderr": subprocess.PIPE, "text": True},
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(list(argv), timeout, out, err) from None
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def start_workload(
    cdi_names: Sequence[str],
    spec_dirs: Sequence[PathArg],
    argv: Sequence[str],
    *,
    uid: int = NOBODY,
    gid: int = NOBODY,
    env: Mapping[str, str] | None = None,
    network: str = "none",
    stdout: int | IO[Any] | None = subprocess.DEVNULL,
    stderr: int | IO[Any] | None = subprocess.DEVNULL,
    ledger: Ledger | None = None,
    device_specs: Sequence[DeviceSpec] = (),
) -> subprocess.Popen[bytes]:
    """Start a long-running workload; returns once argv has been exec'ed (pid = workload).

    The caller stops it (SIGTERM, then SIGKILL) and waits for it. Raises like run_workload.
    """
    return _launch(
        cdi_names, spec_dirs, argv, uid=uid, gid=gid, env=env, network=network, ledger=ledger,
        device_specs=device_specs,
        popen_kw={"stdin": subprocess.DEVNULL, "stdout": stdout, "stderr": stderr},
    )  # fmt: skip


@functools.lru_cache(maxsize=8)
def workload_python(uid: int = NOBODY, gid: int = NOBODY) -> str:
    """A Python >= 3.11 that uid/gid can exec and that imports the staged hvconform.guest;
    NoWorkloadPython (one line naming every candidate) when there is none."""

    def run(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
        try:
            res = run_workload([], [], argv, uid=uid, gid=gid, env=env, timeout=30)
        except WorkloadStartError as exc:
            return exc.code or 126, str(exc)
        return res.returncode, res.stderr

    return choose_python(str(STAGE.path()), run, uid, gid)


def guest_command(
    *args: str, drop_privileges: bool = True, uid: int = NOBODY, gid: int = NOBODY
) -> tuple[list[str], dict[str, str]]:
    """argv and env that run `python -m hvconform.guest ARGS` as a workload of uid/gid."""
    program = Program(workload_python(uid, gid), str(STAGE.path()))
    argv, env = program.command(*args)
    if drop_privileges:
        argv.append("--drop-privileges")
    return argv, env
