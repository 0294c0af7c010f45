"""A read storm on one file: `python -m conformance.targets.reader PATH --accept F ... --out J`.

Reads the file in a tight loop until SIGTERM and classifies every read as one of the accepted
contents, an unexpected content (torn or foreign) or an error. Stdlib only: it may run on a node.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conformance.targets.reader", description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--accept", action="append", default=[], help="file with accepted content")
    parser.add_argument("--out", required=True, help="where to write the JSON stats")
    parser.add_argument("--ready", help="file created once reading has begun")
    ns = parser.parse_args(argv)
    accepted = [Path(p).read_bytes() for p in ns.accept]
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    reads = errors = unexpected = 0
    first_seen: dict[int, float] = {}
    samples: list[str] = []
    if ns.ready:
        Path(ns.ready).touch()
    while not stop:
        try:
            with open(ns.path, "rb") as f:
                data = f.read()
        except OSError as exc:
            errors += 1
            if len(samples) < 5:
                samples.append(f"error: {exc}")
            continue
        reads += 1
        try:
            index = accepted.index(data)
        except ValueError:
            unexpected += 1
            if len(samples) < 5:
                samples.append(f"unexpected {len(data)} bytes: {data[:60]!r}")
            continue
        first_seen.setdefault(index, time.monotonic())
    out = {
        "reads": reads,
        "errors": errors,
        "unexpected": unexpected,
        "first_seen": {str(k): v for k, v in first_seen.items()},
        "samples": samples,
    }
    tmp = Path(ns.out + ".tmp")
    tmp.write_text(json.dumps(out))
    tmp.replace(ns.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
