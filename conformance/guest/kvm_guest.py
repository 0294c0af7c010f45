"""A real x86 real-mode guest driven through raw KVM ioctls (standard library only).

The ioctl numbers and struct layouts are written out here from the Linux KVM API (x86_64);
nothing is generated or imported from a binding.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import mmap
import os
import signal
import stat
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

KVM_API_VERSION = 12


def _ioc(direction: int, nr: int, size: int) -> int:
    # Linux asm-generic ioctl encoding: dir(2 bits) | size(14) | type(8) | nr(8); KVM type 0xAE.
    return (direction << 30) | (size << 16) | (0xAE << 8) | nr


_IOC_NONE, _IOC_WRITE, _IOC_READ = 0, 1, 2

# struct kvm_userspace_memory_region: u32 slot, u32 flags, u64 gpa, u64 size, u64 uaddr.
_MEM_REGION = struct.Struct("=IIQQQ")
# struct kvm_regs: rax rbx rcx rdx rsi rdi rsp rbp r8..r15 rip rflags (18 x u64).
_REGS = struct.Struct("=18Q")
# struct kvm_sregs: 8 x kvm_segment (24 bytes), gdt+idt (16 each), 7 control u64, 4 u64 bitmap.
_SREGS_SIZE = 8 * 24 + 2 * 16 + 7 * 8 + 4 * 8
_SEG_SIZE = 24
# struct kvm_run head: u8 x2, pad[6], u32 exit_reason, u8 x2, u16 flags, u64 cr8, u64 apic_base;
# the exit union starts at 32. io: u8 direction, u8 size, u16 port, u32 count, u64 data_offset.
_RUN_EXIT_REASON = struct.Struct("=I")
_RUN_EXIT_OFFSET = 8
_RUN_UNION_OFFSET = 32
_RUN_IO = struct.Struct("=BBHIQ")

KVM_GET_API_VERSION = _ioc(_IOC_NONE, 0x00, 0)
KVM_CREATE_VM = _ioc(_IOC_NONE, 0x01, 0)
KVM_GET_VCPU_MMAP_SIZE = _ioc(_IOC_NONE, 0x04, 0)
KVM_CREATE_VCPU = _ioc(_IOC_NONE, 0x41, 0)
KVM_SET_USER_MEMORY_REGION = _ioc(_IOC_WRITE, 0x46, _MEM_REGION.size)
KVM_RUN = _ioc(_IOC_NONE, 0x80, 0)
KVM_GET_REGS = _ioc(_IOC_READ, 0x81, _REGS.size)
KVM_SET_REGS = _ioc(_IOC_WRITE, 0x82, _REGS.size)
KVM_GET_SREGS = _ioc(_IOC_READ, 0x83, _SREGS_SIZE)
KVM_SET_SREGS = _ioc(_IOC_WRITE, 0x84, _SREGS_SIZE)

EXIT_NAMES = {
    0: "UNKNOWN",
    1: "EXCEPTION",
    2: "IO",
    5: "HLT",
    6: "MMIO",
    8: "SHUTDOWN",
    9: "FAIL_ENTRY",
    17: "INTERNAL_ERROR",
}
KVM_EXIT_IO, KVM_EXIT_HLT = 2, 5

GUEST_BASE = 0x1000  # guest-physical address of the memory slot (and of the code)
GUEST_SIZE = 0x10000  # 64 KiB
COUNTER_ADDR = 0x2000  # guest-physical address of the counter (real mode: DS base 0)
OUT_PORT = 0x3F8
_MAX_EXITS = 16  # the guests below exit twice; more means something went wrong


class KvmError(Exception):
    """A KVM step failed; the message names the step and the cause."""

    def __init__(self, message: str, exits: list[str] | None = None) -> None:
        super().__init__(message)
        self.exits: list[str] = exits or []


@dataclass
class GuestResult:
    """Outcome of one guest run. `value` is what the guest wrote to OUT_PORT."""

    value: int | None
    expected: int
    exits: list[str] = field(default_factory=list)
    ok: bool = False
    reason: str = ""
    duration_s: float = 0.0


def _u16(x: int) -> bytes:
    return struct.pack("<H", x)


def compute_code(a: int, b: int) -> bytes:
    """16-bit code: ax=a, bx=b, ax = a*b + a + b, out 0x3f8, ax; hlt."""
    return b"".join(
        [
            b"\xb8" + _u16(a),  # mov ax, a
            b"\xbb" + _u16(b),  # mov bx, b
            b"\x89\xc1",  # mov cx, ax
            b"\xf7\xe3",  # mul bx      (dx:ax = ax*bx)
            b"\x01\xc8",  # add ax, cx
            b"\x01\xd8",  # add ax, bx
            b"\xba" + _u16(OUT_PORT),  # mov dx, port
            b"\xef",  # out dx, ax
            b"\xf4",  # hlt
        ]
    )


def expected_value(a: int, b: int) -> int:
    """What compute_code leaves in ax (16-bit wrap-around)."""
    return (a * b + a + b) & 0xFFFF


# 32-bit operand size (0x66) so the counter does not wrap at 65536.
COUNTER_CODE = b"".join(
    [
        b"\x66\xa1" + _u16(COUNTER_ADDR),  # mov eax, [COUNTER_ADDR]
        b"\x66\x40",  # inc eax
        b"\x66\xa3" + _u16(COUNTER_ADDR),  # mov [COUNTER_ADDR], eax
        b"\xba" + _u16(OUT_PORT),  # mov dx, port
        b"\x66\xef",  # out dx, eax
        b"\xf4",  # hlt
    ]
)


def _ioctl(fd: int, request: int, arg: int | bytes | bytearray, step: str) -> int:
    """ioctl returning its int result; a bytearray is filled in place (the _GET_ calls)."""
    try:
        if isinstance(arg, bytearray):
            filled: int = fcntl.ioctl(fd, request, arg, True)
            return filled
        if isinstance(arg, bytes):
            fcntl.ioctl(fd, request, arg)  # returns a copy of the input buffer; result is 0
            return 0
        return fcntl.ioctl(fd, request, arg)
    except OSError as exc:
        raise KvmError(f"{step} failed: {exc.strerror or exc} (errno {exc.errno})") from exc


def _who_and_node(path: str) -> str:
    """Context for an open failure: our ids versus the node's owner and mode."""
    who = f"as uid {os.geteuid()} gid {os.getegid()}"
    try:
        st = Path(path).stat()
    except OSError:
        return who
    return f"{who}; node owner {st.st_uid}:{st.st_gid} mode {stat.S_IMODE(st.st_mode):04o}"


class KvmVm:
    """One VM with one vCPU and one 64 KiB memory slot; close() releases every fd and mapping."""

    def __init__(self, device_path: str) -> None:
        self._fds: list[int] = []
        self._maps: list[mmap.mmap] = []
        try:
            self._setup(device_path)
        except BaseException:
            self.close()
            raise

    def _setup(self, device_path: str) -> None:
        try:
            kvm = os.open(device_path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            raise KvmError(
                f"open {device_path} failed: {exc.strerror} (errno {exc.errno}) "
                f"{_who_and_node(device_path)}"
            ) from exc
        self._fds.append(kvm)
        st = os.fstat(kvm)
        if not stat.S_ISCHR(st.st_mode):
            raise KvmError(f"{device_path} is not a character device")
        dev = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        try:
            version = _ioctl(kvm, KVM_GET_API_VERSION, 0, "KVM_GET_API_VERSION")
        except KvmError as exc:
            raise KvmError(f"{device_path} (char {dev}) is not a KVM device: {exc}") from exc
        if version != KVM_API_VERSION:
            raise KvmError(f"KVM API version {version}, expected {KVM_API_VERSION}")
        vm = _ioctl(kvm, KVM_CREATE_VM, 0, "KVM_CREATE_VM")
        self._fds.append(vm)
        self._mem = mmap.mmap(-1, GUEST_SIZE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._maps.append(self._mem)
        # The exported buffer is dropped at once so munmap (close) stays possible later.
        uaddr = ctypes.addressof(ctypes.c_char.from_buffer(self._mem))
        region = _MEM_REGION.pack(0, 0, GUEST_BASE, GUEST_SIZE, uaddr)
        _ioctl(vm, KVM_SET_USER_MEMORY_REGION, region, "KVM_SET_USER_MEMORY_REGION")
        run_size = _ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE")
        self._vcpu = _ioctl(vm, KVM_CREATE_VCPU, 0, "KVM_CREATE_VCPU")
        self._fds.append(self._vcpu)
        self._run = mmap.mmap(self._vcpu, run_size, mmap.MAP_SHARED)
        self._maps.append(self._run)
        sregs = bytearray(_SREGS_SIZE)
        _ioctl(self._vcpu, KVM_GET_SREGS, sregs, "KVM_GET_SREGS")
        # Real mode, flat at 0: CS (segment 0) and DS (segment 1) with base 0, selector 0.
        for seg in (0, 1):
            struct.pack_into("=Q", sregs, seg * _SEG_SIZE, 0)
            struct.pack_into("=H", sregs, seg * _SEG_SIZE + 12, 0)
        _ioctl(self._vcpu, KVM_SET_SREGS, bytes(sregs), "KVM_SET_SREGS")

    def write(self, guest_addr: int, data: bytes) -> None:
        """Copy bytes into guest memory at a guest-physical address."""
        off = guest_addr - GUEST_BASE
        if off < 0 or off + len(data) > GUEST_SIZE:
            raise ValueError(f"guest range {guest_addr:#x}+{len(data)} outside the memory slot")
        self._mem[off : off + len(data)] = data

    def read_u32(self, guest_addr: int) -> int:
        """Read a little-endian u32 from guest memory."""
        off = guest_addr - GUEST_BASE
        value: int = struct.unpack_from("<I", self._mem, off)[0]
        return value

    def enter(self, rip: int) -> tuple[list[str], list[int]]:
        """Set RIP/RFLAGS, run until HLT; return (exit labels, values written by OUT)."""
        regs = bytearray(_REGS.size)
        _ioctl(self._vcpu, KVM_GET_REGS, regs, "KVM_GET_REGS")
        fields = list(_REGS.unpack(regs))
        fields[16], fields[17] = rip, 0x2  # rip, rflags (bit 1 is reserved-set)
        _ioctl(self._vcpu, KVM_SET_REGS, _REGS.pack(*fields), "KVM_SET_REGS")
        exits: list[str] = []
        outs: list[int] = []
        for _ in range(_MAX_EXITS):
            _ioctl(self._vcpu, KVM_RUN, 0, "KVM_RUN")
            (reason,) = _RUN_EXIT_REASON.unpack_from(self._run, _RUN_EXIT_OFFSET)
            if reason == KVM_EXIT_HLT:
                exits.append("HLT")
                return exits, outs
            if reason == KVM_EXIT_IO:
                direction, size, port, count, data_off = _RUN_IO.unpack_from(
                    self._run, _RUN_UNION_OFFSET
                )
                data = bytes(self._run[data_off : data_off + size])
                value = int.from_bytes(data, "little")
                kind = "out" if direction == 1 else "in"
                exits.append(f"IO:{kind}:{port:#x}:{size}:{value:#x}")
                if kind == "out" and count == 1:
                    outs.append(value)
                continue
            # FAIL_ENTRY carries a u64 hardware reason, INTERNAL_ERROR a u32 suberror.
            (detail,) = struct.unpack_from(
                "=Q" if reason == 9 else "=I", self._run, _RUN_UNION_OFFSET
            )
            exits.append(f"{EXIT_NAMES.get(reason, f'EXIT_{reason}')}:{detail:#x}")
            raise KvmError(f"guest stopped with unexpected exit {exits[-1]}", exits)
        raise KvmError(f"no HLT within {_MAX_EXITS} exits", exits)

    def close(self) -> None:
        """Unmap and close everything; safe to call twice."""
        while self._maps:
            self._maps.pop().close()
        while self._fds:
            os.close(self._fds.pop())

    def __enter__(self) -> KvmVm:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def run_guest(device_path: str, a: int, b: int) -> GuestResult:
    """Fresh VM: run compute_code(a, b) to HLT, then dispose of it. KVM failures go in `reason`."""
    if not (0 <= a <= 0xFFFF and 0 <= b <= 0xFFFF):
        raise ValueError(f"inputs must be 0..65535, got a={a} b={b}")
    result = GuestResult(value=None, expected=expected_value(a, b))
    start = time.monotonic()
    try:
        with KvmVm(device_path) as vm:
            vm.write(GUEST_BASE, compute_code(a, b))
            result.exits, outs = vm.enter(GUEST_BASE)
        if len(outs) != 1:
            result.reason = f"expected one OUT to {OUT_PORT:#x}, saw exits {result.exits}"
        else:
            result.value = outs[0]
            result.ok = result.value == result.expected
            if not result.ok:
                result.reason = f"guest wrote {result.value}, expected {result.expected}"
    except KvmError as exc:
        result.reason = str(exc)
        result.exits = exc.exits
    result.duration_s = time.monotonic() - start
    return result


STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def write_state(state_file: str, counter: int, ok: bool, last_error: str) -> None:
    """Replace state_file atomically (temp file in the same directory, then rename)."""
    state = {
        "counter": counter,
        "pid": os.getpid(),
        "ok": ok,
        "last_error": last_error,
        "ts": time.time(),
    }
    target = Path(state_file)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(state) + "\n", encoding="utf-8")
        # rename is what makes readers see old or new, never a torn file; no fsync needed.
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def run_counter(
    device_path: str,
    state_file: str,
    interval_s: float = 0.1,
    max_iterations: int | None = None,
) -> int:
    """Keep ONE VM; each iteration re-enters the guest, which increments a counter in its memory.

    Returns 0 after SIGTERM/SIGINT or max_iterations, 1 when a KVM step fails. Call from the main
    thread: the stop signals are blocked and collected with sigtimedwait, so a signal never
    interrupts KVM_RUN and the wait between iterations ends as soon as one arrives.
    """
    if interval_s < 0:
        raise ValueError(f"interval must be >= 0, got {interval_s}")
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    counter = 0
    try:
        try:
            vm = KvmVm(device_path)
        except KvmError as exc:
            write_state(state_file, counter, False, str(exc))
            return 1
        with vm:
            vm.write(GUEST_BASE, COUNTER_CODE)
            vm.write(COUNTER_ADDR, bytes(4))
            done = 0
            while max_iterations is None or done < max_iterations:
                try:
                    _, outs = vm.enter(GUEST_BASE)
                except KvmError as exc:
                    write_state(state_file, counter, False, str(exc))
                    return 1
                stored = vm.read_u32(COUNTER_ADDR)
                if outs != [stored] or stored != counter + 1:
                    error = f"guest counter {stored} (out {outs}) after {counter}"
                    write_state(state_file, counter, False, error)
                    return 1
                counter, done = stored, done + 1
                write_state(state_file, counter, True, "")
                if max_iterations is not None and done >= max_iterations:
                    break
                if signal.sigtimedwait(STOP_SIGNALS, interval_s) is not None:
                    break
        return 0
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
