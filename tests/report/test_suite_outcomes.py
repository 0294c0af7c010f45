"""hvconform.suite.outcomes: what ended a test phase becomes typed fields, read from the
exception object, never from pytest's text (which may say anything: it is only a display)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest

from hvconform.contract.results import Blocked, EnvironmentBlocked, NotApplicable
from hvconform.contract.wait import expired
from hvconform.suite import outcomes


class Item:
    """What of_call reads of a pytest item: its stash."""

    def __init__(self) -> None:
        self.stash = pytest.Stash()


def ended(raise_it: Callable[[], None], item: Item | None = None) -> dict[str, Any] | None:
    call = pytest.CallInfo.from_call(raise_it, when="call")
    return outcomes.of_call(cast(pytest.Item, item or Item()), call)


def test_a_typed_outcome_keeps_its_status_whatever_its_words() -> None:
    def worded_like_another_status() -> None:
        outcomes.skip(NotApplicable("blocked: the words say blocked"))

    assert ended(worded_like_another_status) == {
        "status": "not_applicable",
        "reason": "blocked: the words say blocked",
    }

    def dirty() -> None:
        outcomes.skip(Blocked("restart-plugin left the node dirty: a mount"))

    assert ended(dirty) == {
        "status": "blocked",
        "reason": "restart-plugin left the node dirty: a mount",
    }


def test_an_untyped_skip_is_skipped_even_when_worded_as_a_status() -> None:
    def plain() -> None:
        pytest.skip("environment_blocked: no /dev/kvm")

    assert ended(plain) == {"status": "skipped", "reason": "environment_blocked: no /dev/kvm"}


def test_preflights_marker_skip_reads_the_stashed_outcome() -> None:
    item = Item()
    item.stash[outcomes.STASHED] = EnvironmentBlocked("kubelet 1.30 needed, found 1.29")

    def marker() -> None:
        pytest.skip("whatever the marker said")

    assert ended(marker, item) == {
        "status": "environment_blocked",
        "reason": "kubelet 1.30 needed, found 1.29",
    }


def test_failures_carry_their_kind_and_wait() -> None:
    def wait() -> None:
        raise expired("allocatable > 0 (after restore)", 60, 0)

    found = ended(wait)
    assert found is not None
    assert (found["status"], found["failure"], found["wait"]["view"]) == (
        "failed",
        "wait",
        "kubelet",
    )
    assert found["reason"].startswith("waited 60 s for allocatable > 0")

    def assertion() -> None:
        raise AssertionError("3 torn reads")

    assert ended(assertion) == {
        "status": "failed",
        "reason": "3 torn reads",
        "failure": "assertion",
    }

    def broke() -> None:
        raise RuntimeError("boom")

    assert ended(broke) == {
        "status": "failed",
        "reason": "the check could not go on: boom",
        "failure": "error",
    }
    assert ended(lambda: None) is None
