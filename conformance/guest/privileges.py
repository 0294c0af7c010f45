"""Drop to an unprivileged uid/gid with no capabilities and no_new_privs (standard library only).

This reproduces what a hardened pod gets (runAsUser 65534, capabilities drop ALL,
allowPrivilegeEscalation false) so the guest can be shown to work without privilege.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

NOBODY = 65534

PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


class PrivilegeError(Exception):
    """Dropping or verifying privileges failed; the message says which step."""


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _libc() -> ctypes.CDLL:
    # The running interpreter already links libc; CDLL(None) finds its symbols.
    return ctypes.CDLL(None, use_errno=True)


def _prctl(libc: ctypes.CDLL, name: str, option: int, arg2: int = 0, hint: str = "") -> int:
    zero = ctypes.c_ulong(0)
    ret = int(libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg2), zero, zero, zero))
    if ret < 0:
        err = ctypes.get_errno()
        raise PrivilegeError(f"prctl({name}, {arg2}) failed: {os.strerror(err)}{hint}")
    return ret


def cap_last_cap() -> int:
    """Highest capability number the kernel knows."""
    return int(Path("/proc/sys/kernel/cap_last_cap").read_text(encoding="ascii"))


def read_status() -> dict[str, str]:
    """/proc/self/status as a dict of field -> whitespace-normalised value."""
    fields: dict[str, str] = {}
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        key, _, value = line.partition(":")
        fields[key] = " ".join(value.split())
    return fields


def verify_dropped(uid: int = NOBODY, gid: int = NOBODY) -> dict[str, str]:
    """Check uid/gid, no groups, zero capability sets and NoNewPrivs=1; return those fields."""
    status = read_status()
    want = {
        "Uid": " ".join([str(uid)] * 4),
        "Gid": " ".join([str(gid)] * 4),
        "Groups": "",
        "NoNewPrivs": "1",
    }
    problems = [
        f"{key}={status.get(key)!r} (want {value!r})"
        for key, value in want.items()
        if status.get(key) != value
    ]
    for key in CAP_FIELDS:
        value = status.get(key, "")
        if not value or int(value, 16) != 0:
            problems.append(f"{key}={value!r} (want 0)")
    if problems:
        raise PrivilegeError("privileges not dropped: " + "; ".join(problems))
    return {key: status[key] for key in (*want, *CAP_FIELDS)}


def drop_privileges(uid: int = NOBODY, gid: int = NOBODY) -> dict[str, str]:
    """Drop to uid/gid with no capabilities at all, then verify; irreversible for the process."""
    libc = _libc()
    _prctl(libc, "PR_SET_NO_NEW_PRIVS", PR_SET_NO_NEW_PRIVS, 1)
    _prctl(libc, "PR_CAP_AMBIENT_CLEAR_ALL", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    hint = " (needs CAP_SETPCAP: start as root, or with the bounding set already empty)"
    # The bounding set must go while CAP_SETPCAP is still held, i.e. before setuid; a cap that
    # is already out of the set is skipped so an already-unprivileged caller does not fail here.
    for cap in range(cap_last_cap() + 1):
        if _prctl(libc, "PR_CAPBSET_READ", PR_CAPBSET_READ, cap) == 1:
            _prctl(libc, "PR_CAPBSET_DROP", PR_CAPBSET_DROP, cap, hint)
    # Each switch only when needed: a pod already running as uid/gid may not call them.
    try:
        if os.getgroups():
            os.setgroups([])
        if os.getresgid() != (gid, gid, gid):
            os.setresgid(gid, gid, gid)
        if os.getresuid() != (uid, uid, uid):
            os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise PrivilegeError(f"switching to uid {uid} gid {gid} failed: {exc.strerror}") from exc
    # setuid away from 0 clears permitted/effective/ambient but not inheritable: zero them all.
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise PrivilegeError(f"capset to zero failed: {os.strerror(ctypes.get_errno())}")
    return verify_dropped(uid, gid)
