"""The tests' own session, as a run would: what a killed run (a test that SIGKILLs one) left of
the host's /run/netns is released at the end, and said, so a leak is seen in CI's log and never
outlives the tests (hvconform.targets.host.netns.release_stale_run_dir)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from hvconform.contract import settings


@pytest.fixture(autouse=True)
def _no_run_settings_left() -> Iterator[None]:
    """A test that ran the CLI in-process installed its run's settings: the next test reads its
    own environment (monkeypatched HV_HELM and the like), as any process outside a run does."""
    yield
    settings.uninstall()


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or os.geteuid() != 0:
        return  # the controller only; without root no test made one
    from hvconform.targets.host.netns import release_stale_run_dir

    if release_stale_run_dir():
        print("\nhvconform tests: released a /run/netns mount a killed run left on the host")
