"""`hvconform metadata`: snapshot, check-startup and check-final on the command line.

Exit 0 when accepted, 1 when rejected, 2 for unusable input; the verdict is one line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hvconform.contract.args import OneLineParser
from hvconform.contract.safewrite import write_atomic
from hvconform.contract.strict_json import JsonInputError, decode, one_line
from hvconform.metadata.rules import (
    SNAPSHOT_MAX_BYTES,
    MetadataInputError,
    Verdict,
    check_final,
    check_startup,
    checked_node_gid,
    dump_snapshot,
    error_verdict,
    load_snapshot,
    parse_group_lookup,
    read_group_lookup,
    snapshot,
)

EXIT_ERROR = 2
DESCRIPTION = """\
Two-phase check of a host device's metadata (type, major, minor, mode, uid, gid).
A bind-mounted /dev/kvm is the host's own inode: a KIND node's udev may chgrp it.
  startup: unchanged, or ONLY the gid changed and only to the node's kvm group
  final:   exactly the validated snapshot (the original one without --validated)
A missing or non-character device is rejected in both phases.
Exit 0 accepted, 1 rejected, 2 unusable input; the verdict is one line.
"""
EPILOG = """\
example (KIND):
  hvconform metadata snapshot --out original.json
  kind create cluster ...
  docker exec NODE getent group kvm > lookup.txt
  hvconform metadata snapshot --out startup.json
  hvconform metadata check-startup --original original.json --current startup.json \\
      --group-lookup lookup.txt && cp startup.json validated.json
  ... plugin tests, cleanup ...
  hvconform metadata snapshot --out final.json
  hvconform metadata check-final --original original.json [--validated validated.json] \\
      --current final.json
"""


def _report(verdict: Verdict) -> int:
    error = verdict.status == "error"
    # An error names a path the user gave: one line, control characters shown, never acted on.
    message = one_line(verdict.message, limit=2000) if error else verdict.message
    print(message, file=sys.stderr if error else sys.stdout, flush=True)
    return verdict.exit_code


def run_snapshot(ns: argparse.Namespace) -> int:
    try:
        text = dump_snapshot(snapshot(ns.device))
        if ns.out == "-":
            sys.stdout.write(text)
        else:
            write_atomic(Path(ns.out), text)  # never through a symlink planted at the name
    except (MetadataInputError, OSError) as exc:
        message = f"error: snapshot of {ns.device} to {ns.out} failed: {exc}"
        print(one_line(message, limit=2000), file=sys.stderr)
        return EXIT_ERROR
    return 0


def _node_kvm_gid(ns: argparse.Namespace) -> int:
    if ns.group_lookup is None:
        return checked_node_gid(ns.node_kvm_gid)
    if ns.group_lookup != "-":
        return read_group_lookup(ns.group_lookup)
    # "-": piped, e.g. from `docker exec NODE getent group kvm`; a failed getent prints nothing.
    stdin = getattr(
        sys.stdin, "buffer", None
    )  # a text stream without bytes (tests) is read as text
    raw = (
        stdin.read(SNAPSHOT_MAX_BYTES + 1)
        if stdin is not None
        else sys.stdin.read(SNAPSHOT_MAX_BYTES + 1).encode()
    )
    if len(raw) > SNAPSHOT_MAX_BYTES:
        raise MetadataInputError(f"group lookup on stdin: more than {SNAPSHOT_MAX_BYTES} bytes")
    try:
        return parse_group_lookup(decode(raw, label="group lookup on stdin"))
    except JsonInputError as exc:
        raise MetadataInputError(str(exc)) from None


def run_check_startup(ns: argparse.Namespace) -> int:
    try:
        original = load_snapshot(ns.original, "original snapshot")
        current = load_snapshot(ns.current, "current snapshot")
        gid = _node_kvm_gid(ns)
    except MetadataInputError as exc:
        return _report(error_verdict("startup", str(exc)))
    return _report(check_startup(original, current, gid))


def run_check_final(ns: argparse.Namespace) -> int:
    try:
        original = load_snapshot(ns.original, "original snapshot")
        validated = (
            None if ns.validated is None else load_snapshot(ns.validated, "validated snapshot")
        )
        current = load_snapshot(ns.current, "current snapshot")
    except MetadataInputError as exc:
        return _report(error_verdict("final", str(exc)))
    return _report(check_final(original, validated, current))


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `metadata` and its three commands to hvconform's subparsers."""
    meta = sub.add_parser(
        "metadata",
        help="two-phase host /dev/kvm metadata check (exit 0 accepted, 1 rejected, 2 error)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = meta.add_subparsers(dest="metadata_command", required=True, metavar="COMMAND")
    snap = commands.add_parser("snapshot", help="record the device's metadata as JSON")
    snap.add_argument("--device", default="/dev/kvm", help="absolute path (default /dev/kvm)")
    snap.add_argument("--out", required=True, metavar="FILE", help="JSON output ('-': stdout)")
    snap.set_defaults(func=run_snapshot)

    startup = commands.add_parser(
        "check-startup", help="phase one: unchanged, or only the gid to the node's kvm group"
    )
    startup.add_argument("--original", required=True, metavar="FILE")
    startup.add_argument("--current", required=True, metavar="FILE")
    node = startup.add_mutually_exclusive_group(required=True)
    node.add_argument("--node-kvm-gid", metavar="N", help="the node's kvm group id")
    node.add_argument(
        "--group-lookup",
        metavar="FILE",
        help="getent-style output from inside the node, e.g. 'kvm:x:993:' ('-': stdin)",
    )
    startup.set_defaults(func=run_check_startup)

    final = commands.add_parser(
        "check-final", help="phase two: exactly the validated (else original) snapshot"
    )
    final.add_argument("--original", required=True, metavar="FILE")
    final.add_argument(
        "--validated",
        metavar="FILE",
        help="the snapshot check-startup accepted; omit when startup validation did not complete",
    )
    final.add_argument("--current", required=True, metavar="FILE")
    final.set_defaults(func=run_check_final)


def main(argv: Sequence[str] | None = None) -> int:
    """`hvconform metadata ...` without the rest of hvconform (tests, `python -m`)."""
    parser: argparse.ArgumentParser = OneLineParser(prog="hvconform")
    register(parser.add_subparsers(dest="command", required=True))
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        ns = parser.parse_args(args if args[:1] == ["metadata"] else ["metadata", *args])
    except SystemExit as exc:  # argparse: bad arguments (2) or --help (0)
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    code: int = ns.func(ns)
    return code


main_for_tests = main

if __name__ == "__main__":
    sys.exit(main())
