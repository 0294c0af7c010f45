"""Fuzzing the other files hvconform reads back: metadata snapshots and `bench --compare`'s
older bench.json. Each is refused with one line (MetadataInputError / a complaint, so exit 2) or
accepted and usable; never a crash, however deep, binary or numerically absurd the file is.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hvconform.bench.report import SCHEMA, compare, compare_warnings, load_report, render_compare
from hvconform.contract import strict_json
from hvconform.metadata.rules import (
    KINDS,
    VERSION,
    MetadataInputError,
    Snapshot,
    check_final,
    check_startup,
    dump_snapshot,
    load_snapshot,
    parse_snapshot_text,
    snapshot,
)
from hvconform.metadata.rules import SCHEMA as METADATA_SCHEMA

SETTINGS = settings(
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
GOOD = dump_snapshot(snapshot("/dev/kvm")).encode()

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
numbers = st.one_of(st.none(), st.booleans(), st.integers(-1, 2**32 + 1), st.floats())
# Each snapshot field fuzzed near its bounds.
FIELD_VALUES = {
    "schema": st.sampled_from([METADATA_SCHEMA, "hvconform.other", ""]),
    "version": st.sampled_from([VERSION, VERSION + 1, str(VERSION), True]),
    "path": st.one_of(st.just("/dev/kvm"), st.text(max_size=12)),
    "type": st.sampled_from([*KINDS, ""]),
    "major": numbers,
    "minor": numbers,
    "mode": st.one_of(st.from_regex(r"[0-7]{4}", fullmatch=True), st.text(max_size=5)),
    "uid": numbers,
    "gid": numbers,
}


@st.composite
def near_snapshots(draw: st.DrawFn) -> dict[str, Any]:
    """The live device's snapshot with up to two fields replaced: valid or nearly so."""
    good: dict[str, Any] = json.loads(GOOD)
    for key in draw(st.sets(st.sampled_from(sorted(FIELD_VALUES)), max_size=2)):
        good[key] = draw(FIELD_VALUES[key])
    return good


snapshot_like = st.one_of(json_values, near_snapshots())


def _mutate(data: bytes, edits: list[tuple[int, bytes]]) -> bytes:
    for at, insert in edits:
        at %= len(data) + 1
        data = data[:at] + insert + data[at:]
    return data


raw_files = st.one_of(
    st.binary(max_size=120),
    st.lists(st.tuples(st.integers(0, len(GOOD)), st.binary(max_size=6)), max_size=4).map(
        lambda edits: _mutate(GOOD, edits)
    ),
    st.integers(1, 3000).map(lambda n: b"[" * n + GOOD + b"]" * n),
    st.sampled_from([b"NaN", b'{"major": Infinity}', b"1e999", b"\xc3\x28", b""]),
)


@pytest.fixture(scope="module")
def work() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hv-input-fuzz-") as where:
        yield Path(where)


@SETTINGS
@given(snapshot_like)
def test_snapshot_text_is_parsed_strictly_or_refused(value: Any) -> None:
    try:
        parsed = parse_snapshot_text(json.dumps(value), "snapshot")
    except MetadataInputError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(parsed, Snapshot)
    # Whatever parses can be judged in both phases, against itself and the live device.
    live = snapshot("/dev/kvm")
    assert check_startup(parsed, parsed, 36).status in ("accepted", "rejected")
    assert check_final(live, None, parsed).status in ("accepted", "rejected")


@SETTINGS
@given(raw_files)
@example(b"[" * 100_000)
def test_snapshot_files_of_any_bytes(work: Path, raw: bytes) -> None:
    path = work / "snapshot.json"
    path.write_bytes(raw)
    try:
        load_snapshot(path, "current snapshot")
    except MetadataInputError as exc:
        assert "\n" not in str(exc) and "current snapshot" in str(exc)


NEW = {
    "schema": SCHEMA,
    "quick": True,
    "machine": {"cores": 2, "cpu_model": "x", "kernel": "6"},
    "figures": [
        {"key": k, "name": k, "unit": "ms", "median": 5.0, "better": b, "load": {"busy_pct": 10}}
        for k, b in (("a", "lower"), ("b", "higher"), ("c", "lower"))
    ],
}
figures = st.fixed_dictionaries(
    {"key": st.one_of(st.sampled_from("abc"), json_values)},
    optional={
        "median": st.one_of(json_values, st.floats(0, 1e300)),
        "load": st.one_of(json_values, st.fixed_dictionaries({"busy_pct": json_values})),
    },
)
bench_like = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {"schema": st.just(SCHEMA)},
        optional={"machine": json_values, "figures": st.lists(figures, max_size=4)},
    ),
)


@SETTINGS
@given(st.one_of(bench_like.map(lambda v: json.dumps(v).encode()), raw_files))
def test_bench_compare_file_is_usable_or_refused(work: Path, raw: bytes) -> None:
    path = work / "old-bench.json"
    path.write_bytes(raw)
    complaints: list[str] = []
    old = load_report(path, complaints.append)
    if old is None:
        assert len(complaints) == 1 and "\n" not in complaints[0]
        return
    rows = compare(NEW, old)  # what `bench --compare` does with an accepted file
    render_compare(rows)
    compare_warnings(NEW, old)
    json.dumps(rows, allow_nan=False)  # bench.json stays valid, strict JSON


def test_the_loader_refuses_what_json_would_take(work: Path) -> None:
    for text, word in (("[NaN]", "NaN"), ("[-Infinity]", "Infinity"), ("[1e400]", "finite")):
        with pytest.raises(strict_json.JsonInputError, match=word):
            strict_json.parse(text, label="x")
    deep = work / "deep.json"
    deep.write_text("{" + '"a":{' * 100_000)
    with pytest.raises(strict_json.JsonInputError, match="nested deeper"):
        strict_json.load(deep, label="x")
    with pytest.raises(strict_json.JsonInputError, match="not a regular file"):
        strict_json.load(Path("/dev/zero"), label="x")
