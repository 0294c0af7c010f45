"""CLI: run a real KVM guest (optionally resolved through CDI, optionally unprivileged)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from hvconform.guest.cdi_resolve import (
    DEFAULT_SPEC_DIRS,
    CDIRegistry,
    ResolvedDevice,
    UnresolvableCDIDevice,
    parse_qualified_name,
)
from hvconform.guest.kvm_guest import OUT_PORT, run_counter, run_guest
from hvconform.guest.privileges import NOBODY, PrivilegeError, drop_privileges

EXIT_OK, EXIT_GUEST_FAILED, EXIT_USAGE, EXIT_SETUP = 0, 1, 2, 3

_EPILOG = f"""\
exit status: 0 every run ok; 1 a guest run or KVM step failed; 2 bad arguments;
3 setup failed (CDI device unresolvable, privileges could not be dropped).

The guest is real x86 code run through KVM ioctls: it loads A and B, computes A*B+A+B
(16-bit), writes it with OUT to port {OUT_PORT:#x} and halts. A run is ok only when the value
the guest wrote equals the expected one.

examples:
  # inside a pod that got the device through CDI (spec dirs: {" then ".join(DEFAULT_SPEC_DIRS)})
  python -m hvconform.guest run --cdi-device hyperlight.dev/hypervisor=kvm --json
  # directly against a node, five runs, as uid/gid {NOBODY} with no capabilities
  python -m hvconform.guest run --device /dev/kvm --runs 5 --drop-privileges
  # long-running: one VM, a guest-held counter written to a state file until SIGTERM
  python -m hvconform.guest counter --device /dev/kvm --state-file /tmp/counter.json
"""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _u16(text: str) -> int:
    value = int(text, 0)
    if not 0 <= value <= 0xFFFF:
        raise argparse.ArgumentTypeError(f"must be 0..65535, got {value}")
    return value


def _interval(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be 0..3600 seconds, got {value}")
    return value


def _cdi_name(text: str) -> str:
    try:
        parse_qualified_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for both subcommands."""
    parser = argparse.ArgumentParser(
        prog="python -m hvconform.guest",
        description="Run a real guest through KVM ioctls to prove a hypervisor device works.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{run,counter}")
    run = sub.add_parser(
        "run",
        help="run the compute guest N times, one fresh VM per run",
        description="Run the compute guest; one fresh VM per run, disposed of afterwards.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument(
        "--cdi-device",
        type=_cdi_name,
        metavar="VENDOR/CLASS=NAME",
        help="resolve this CDI device like a runtime and use its first device node",
    )
    run.add_argument(
        "--cdi-dir",
        action="append",
        metavar="DIR",
        help=f"CDI spec dir, repeatable, later wins (default: {' '.join(DEFAULT_SPEC_DIRS)})",
    )
    run.add_argument(
        "--device",
        metavar="PATH",
        help="device node to open; overrides the CDI node path "
        "(default: the CDI node, else $HYPERLIGHT_DEVICE_PATH)",
    )
    run.add_argument("--runs", type=_positive_int, default=1, help="number of runs (default 1)")
    run.add_argument("--a", type=_u16, default=6, help="first input of run 1 (default 6)")
    run.add_argument("--b", type=_u16, default=7, help="second input of run 1 (default 7)")
    run.add_argument(
        "--drop-privileges",
        action="store_true",
        help=f"before opening the device become uid/gid {NOBODY}, drop every capability "
        "(bounding set too), set no_new_privs, and verify it in /proc/self/status",
    )
    run.add_argument("--json", action="store_true", help="one JSON object per line per run")
    run.set_defaults(subparser=run)
    counter = sub.add_parser(
        "counter",
        help="long-running guest: one VM, a counter in guest memory, until SIGTERM",
        description="Keep one VM and re-enter its guest every interval; the guest increments a "
        "counter in its own memory. The state file is replaced atomically after every "
        'iteration with {"counter", "pid", "ok", "last_error", "ts"}. SIGTERM/SIGINT stop it '
        "cleanly (exit 0); a failed KVM step exits 1.",
    )
    counter.add_argument("--device", required=True, metavar="PATH", help="KVM device node")
    counter.add_argument("--state-file", required=True, metavar="FILE", help="JSON state file")
    counter.add_argument(
        "--interval", type=_interval, default=0.1, help="seconds between iterations (0.1)"
    )
    counter.add_argument(
        "--max-iterations", type=_positive_int, default=None, help="stop after N (default: never)"
    )
    counter.add_argument(
        "--drop-privileges", action="store_true", help=f"run as uid/gid {NOBODY}, no capabilities"
    )
    return parser


def _emit(args: argparse.Namespace, record: dict[str, Any], text: str) -> None:
    print(json.dumps(record, sort_keys=True) if args.json else text, flush=True)


def _setup_error(args: argparse.Namespace, stage: str, message: str) -> int:
    if args.json:
        print(json.dumps({"ok": False, "stage": stage, "reason": message}), flush=True)
    else:
        print(f"error: {stage}: {message}", file=sys.stderr)
    return EXIT_SETUP


def _cmd_run(args: argparse.Namespace) -> int:
    resolved: ResolvedDevice | None = None
    if args.cdi_device:
        registry = CDIRegistry(args.cdi_dir)
        try:
            resolved = registry.resolve(args.cdi_device)
        except UnresolvableCDIDevice as exc:
            details = "; ".join(f"{p}: {'; '.join(e)}" for p, e in sorted(exc.errors.items()))
            dirs = " ".join(registry.spec_dirs)
            return _setup_error(
                args, "cdi", f"{exc} (dirs: {dirs}){' - ' + details if details else ''}"
            )
        if not resolved.node_paths and not args.device:
            return _setup_error(args, "cdi", f"{args.cdi_device} has no deviceNodes")
    device = args.device or (resolved.node_paths[0] if resolved else None)
    device = device or os.environ.get("HYPERLIGHT_DEVICE_PATH")
    if not device:
        subparser: argparse.ArgumentParser = args.subparser
        subparser.error(
            "no device: give --device PATH or --cdi-device VENDOR/CLASS=NAME "
            "(or set HYPERLIGHT_DEVICE_PATH)"
        )
    privileges: dict[str, str] | None = None
    if args.drop_privileges:
        try:
            privileges = drop_privileges()
        except PrivilegeError as exc:
            return _setup_error(args, "privileges", str(exc))
    cdi = None
    if resolved is not None:
        cdi = {
            "name": resolved.name,
            "spec_file": resolved.spec_file,
            "node_paths": resolved.node_paths,
            "env": resolved.env,
        }
    all_ok = True
    for i in range(args.runs):
        a, b = (args.a + i) & 0xFFFF, (args.b + 3 * i) & 0xFFFF
        res = run_guest(device, a, b)
        all_ok = all_ok and res.ok
        record = {
            "run": i + 1,
            "device": device,
            "a": a,
            "b": b,
            "value": res.value,
            "expected": res.expected,
            "ok": res.ok,
            "reason": res.reason,
            "exits": res.exits,
            "duration_s": round(res.duration_s, 6),
            "uid": os.getuid(),
            "gid": os.getgid(),
            "privileges": privileges,
            "cdi": cdi,
        }
        verdict = "ok" if res.ok else f"FAIL: {res.reason}"
        text = (
            f"run {i + 1}: {verdict} device={device} a={a} b={b} value={res.value} "
            f"expected={res.expected} exits={','.join(res.exits)} "
            f"{res.duration_s * 1000:.2f} ms"
        )
        _emit(args, record, text)
    return EXIT_OK if all_ok else EXIT_GUEST_FAILED


def _cmd_counter(args: argparse.Namespace) -> int:
    if args.drop_privileges:
        try:
            drop_privileges()
        except PrivilegeError as exc:
            print(f"error: privileges: {exc}", file=sys.stderr)
            return EXIT_SETUP
    try:
        code = run_counter(args.device, args.state_file, args.interval, args.max_iterations)
    except OSError as exc:
        print(f"error: state file {args.state_file}: {exc.strerror}", file=sys.stderr)
        return EXIT_SETUP
    if code != 0:
        try:
            with open(args.state_file, encoding="utf-8") as fh:
                last_error = json.load(fh).get("last_error", "")
        except (OSError, ValueError):
            last_error = "(state file unreadable)"
        print(f"error: counter: {last_error}", file=sys.stderr)
        return EXIT_GUEST_FAILED
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        return _cmd_run(args)
    return _cmd_counter(args)


if __name__ == "__main__":
    sys.exit(main())
