"""Property-based tests of the two-phase metadata rules (hypothesis)."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hvconform.metadata.rules import (
    KINDS,
    MAX_DEVNUM,
    MAX_ID,
    MetadataInputError,
    Snapshot,
    check_final,
    check_startup,
    dump_snapshot,
    parse_group_lookup,
    parse_snapshot_text,
)

# No example database in the work tree; no deadline on a busy 2-core CI machine. Applied per
# test, so that loading a profile here never changes other modules' hypothesis settings.
SETTINGS = settings(database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ids = st.integers(0, MAX_ID)
node_gids = st.integers(1, MAX_ID)
devnums = st.integers(0, MAX_DEVNUM)
modes = st.integers(0, 0o7777)
FIELDS = ("major", "minor", "mode", "uid")


@st.composite
def char_devices(draw: st.DrawFn, path: str = "/dev/kvm") -> Snapshot:
    return Snapshot(path, "char", draw(devnums), draw(devnums), draw(modes), draw(ids), draw(ids))


@st.composite
def any_snapshots(draw: st.DrawFn) -> Snapshot:
    kind = draw(st.sampled_from(KINDS))
    if kind == "missing":
        return Snapshot("/dev/kvm", kind)
    return dataclasses.replace(draw(char_devices()), kind=kind)


def other_value(data: st.DataObject, field: str, old: int) -> int:
    top = {"mode": 0o7777, "uid": MAX_ID}.get(field, MAX_DEVNUM)
    return data.draw(st.integers(0, top).filter(lambda v: v != old))


def changed(snap: Snapshot, field: str, value: int) -> Snapshot:
    changes: dict[str, Any] = {field: value}
    return dataclasses.replace(snap, **changes)


@SETTINGS
@given(any_snapshots())
def test_snapshot_json_round_trip(snap: Snapshot) -> None:
    assert parse_snapshot_text(dump_snapshot(snap)) == snap


@SETTINGS
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    )
)
def test_arbitrary_json_is_a_snapshot_or_an_input_error(data: Any) -> None:
    try:
        snap = parse_snapshot_text(json.dumps(data))
    except MetadataInputError:
        return
    assert dump_snapshot(snap) == json.dumps(data, indent=2, sort_keys=True) + "\n"


@SETTINGS
@given(char_devices(), st.none() | node_gids)
def test_unchanged_is_accepted_in_both_phases(snap: Snapshot, node_gid: int | None) -> None:
    assert check_startup(snap, snap, node_gid).status == "accepted"
    assert check_final(snap, None, snap).status == "accepted"
    assert check_final(snap, snap, snap).status == "accepted"


@SETTINGS
@given(char_devices(), node_gids)
def test_gid_to_the_node_kvm_group_is_accepted_then_must_stay(
    original: Snapshot, node_gid: int
) -> None:
    validated = dataclasses.replace(original, gid=node_gid)
    verdict = check_startup(original, validated, node_gid)
    assert verdict.status == "accepted", verdict.message
    assert check_final(original, validated, validated).status == "accepted"
    if node_gid != original.gid:
        # Putting the original gid back is a change after validation, and without a validated
        # snapshot the node's gid is a change from the original.
        assert check_final(original, validated, original).status == "rejected"
        assert check_final(original, None, validated).status == "rejected"


@SETTINGS
@given(st.data(), char_devices(), st.none() | node_gids)
def test_gid_elsewhere_is_rejected_at_startup(
    data: st.DataObject, original: Snapshot, node_gid: int | None
) -> None:
    gid = data.draw(ids.filter(lambda g: g not in (original.gid, node_gid)))
    verdict = check_startup(original, dataclasses.replace(original, gid=gid), node_gid)
    assert verdict.status == "rejected"
    assert verdict.message.startswith(f"rejected: gid changed {original.gid} -> {gid} at startup")


@SETTINGS
@given(st.data(), char_devices(), st.sampled_from(FIELDS), node_gids, st.booleans())
def test_any_other_single_field_change_is_rejected_in_both_phases(
    data: st.DataObject, original: Snapshot, field: str, node_gid: int, with_gid: bool
) -> None:
    old = getattr(original, field)
    new = other_value(data, field, old)
    current = changed(original, field, new)
    if with_gid:  # an allowed gid change never excuses another change
        current = dataclasses.replace(current, gid=node_gid)
    shown = (f"{old:04o}", f"{new:04o}") if field == "mode" else (str(old), str(new))
    startup = check_startup(original, current, node_gid)
    assert startup.status == "rejected"
    assert startup.message.startswith(f"rejected: {field} changed {shown[0]} -> {shown[1]}")
    assert "; rule: startup may change only the gid" in startup.message
    validated = dataclasses.replace(original, gid=node_gid)
    final = check_final(original, validated, changed(validated, field, new))
    assert final.status == "rejected" and f"{field} changed" in final.message
    assert final.exit_code == 1


@SETTINGS
@given(any_snapshots(), any_snapshots(), st.none() | node_gids)
def test_verdicts_are_one_line_and_never_accept_a_non_character_device(
    original: Snapshot, current: Snapshot, node_gid: int | None
) -> None:
    for verdict in (
        check_startup(original, current, node_gid),
        check_final(original, None, current),
    ):
        assert "\n" not in verdict.message
        assert verdict.message.startswith(f"{verdict.status}: ")
        if "char" not in (original.kind, current.kind) or original.kind != current.kind:
            assert verdict.status == "rejected"
        if verdict.status == "accepted":
            assert dataclasses.replace(current, gid=original.gid) == original


@SETTINGS
@given(char_devices(), char_devices(), node_gids)
def test_acceptance_means_only_the_gid_moved_to_the_node_group(
    original: Snapshot, current: Snapshot, node_gid: int
) -> None:
    accepted = check_startup(original, current, node_gid).status == "accepted"
    same_but_gid = dataclasses.replace(current, gid=original.gid) == original
    assert accepted == (same_but_gid and current.gid in (original.gid, node_gid))
    assert (check_final(original, None, current).status == "accepted") == (current == original)


group_names = st.from_regex(r"[a-z_][a-z0-9_-]{0,15}", fullmatch=True)
members = st.lists(group_names, max_size=3).map(",".join)


@SETTINGS
@given(node_gids, members, st.lists(st.tuples(group_names, ids), max_size=5))
def test_lookup_finds_the_kvm_gid_among_other_groups(
    gid: int, who: str, others: list[tuple[str, int]]
) -> None:
    assume(all(name != "kvm" for name, _ in others))
    lines = [f"{name}:x:{other}:" for name, other in others]
    lines.insert(len(lines) // 2, f"kvm:x:{gid}:{who}")
    assert parse_group_lookup("\n".join(lines) + "\n") == gid


@SETTINGS
@given(st.text())
def test_a_lookup_never_invents_a_gid(text: str) -> None:
    """Whatever text arrives, a gid comes only from one literal, well-formed kvm line."""
    try:
        gid = parse_group_lookup(text)
    except MetadataInputError:
        return
    found = [
        line for line in text.splitlines() if re.fullmatch(rf"\s*kvm:[^:]*:{gid}:[^:]*\s*", line)
    ]
    assert len(found) == 1 and gid > 0


@pytest.mark.parametrize(
    "text", ["", "\n", "kvm:x::", "kvm:x:-1:", "kvm:x:0:", "kvm:x:4294967295:"]
)
def test_lookup_edge_cases_are_errors(text: str) -> None:
    with pytest.raises(MetadataInputError):
        parse_group_lookup(text)
