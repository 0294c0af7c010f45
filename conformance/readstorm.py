"""A timed read storm: `python -m hvconform.readstorm PATH --accept F ... --out J`.

Reads PATH in a tight loop until SIGTERM. Every read is one of the accepted contents, unexpected
(torn or foreign) or an error; each change of accepted content is stamped with time.monotonic()
(CLOCK_MONOTONIC, the same clock as the harness), so the harness can tell when a repair was
first visible to a reader. Once --min-reads reads are done, the --done file appears.
Standard library only, so its own start-up and loop stay small.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

CLOCK_EVERY = 256  # reads between clock readings for the per-second rate buckets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hvconform.readstorm", description=__doc__)
    parser.add_argument("path")
    parser.add_argument("--accept", action="append", default=[], help="file of accepted content")
    parser.add_argument("--out", required=True, help="JSON results, written at SIGTERM")
    parser.add_argument("--ready", required=True, help="created once reading has begun")
    parser.add_argument("--done", required=True, help="created once --min-reads are done")
    parser.add_argument("--min-reads", type=int, default=100_000)
    ns = parser.parse_args(argv)
    accepted = [Path(p).read_bytes() for p in ns.accept]
    stop = False

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    reads = errors = unexpected = 0
    samples: list[str] = []
    transitions: list[tuple[float, int]] = []
    buckets: list[int] = []  # reads per whole second since the start
    last = -1
    done_marked = False
    started = time.monotonic()
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
        if index != last:
            transitions.append((time.monotonic(), index))
            last = index
        if reads % CLOCK_EVERY == 0:
            second = int(time.monotonic() - started)
            while len(buckets) <= second:
                buckets.append(0)
            buckets[second] += CLOCK_EVERY
            if not done_marked and reads >= ns.min_reads:
                Path(ns.done).touch()
                done_marked = True
    elapsed = time.monotonic() - started
    out = {
        "reads": reads,
        "errors": errors,
        "unexpected": unexpected,
        "elapsed_s": elapsed,
        # The last bucket is partial: only whole seconds are rates.
        "reads_per_second": buckets[:-1],
        "transitions": transitions,
        "samples": samples,
    }
    # Standard library only: the harness's safe writer, inline (fresh O_EXCL temp, no symlink).
    tmp = f"{ns.out}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(out))
    Path(tmp).replace(ns.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
