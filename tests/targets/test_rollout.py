"""The rollout's two pure parts: the rolled DaemonSet differs from the original by the rollout
annotation only (same image, same code), and "complete" is the DaemonSet controller's own view
(new generation observed, every scheduled pod updated and available). Live: the pod route of
tests/realnode/test_cluster_live.py and `nox -s conformance-kind` run rollout-safety for real."""

from __future__ import annotations

import copy
from typing import Any

from hvconform.targets.cluster.rollout import ROLLOUT_ANNOTATION, complete, rolled

DS: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "hv", "namespace": "ns", "generation": 3},
    "spec": {"template": {"metadata": {"labels": {"app": "hv"}},
                          "spec": {"containers": [{"name": "p", "image": "hv:1"}]}}},
}  # fmt: skip


def test_rolled_changes_only_the_annotation_and_leaves_the_original() -> None:
    original = copy.deepcopy(DS)
    new = rolled(DS, "123.456")
    assert original == DS, "the original was modified"
    assert new["spec"]["template"]["metadata"]["annotations"] == {ROLLOUT_ANNOTATION: "123.456"}
    del new["spec"]["template"]["metadata"]["annotations"]
    assert new == original


def _with(**status: int) -> dict[str, Any]:
    return {**DS, "status": status}


def test_complete_is_the_controllers_view() -> None:
    done = {"observedGeneration": 3, "desiredNumberScheduled": 2, "updatedNumberScheduled": 2,
            "numberAvailable": 2}  # fmt: skip
    assert complete(_with(**done))
    assert not complete(None)
    assert not complete(_with(**{**done, "observedGeneration": 2})), "old generation observed"
    assert not complete(_with(**{**done, "updatedNumberScheduled": 1})), "one pod not updated"
    assert not complete(_with(**{**done, "numberAvailable": 1})), "one pod not available"
    assert not complete(_with(**{**done, "desiredNumberScheduled": 0,
                                 "updatedNumberScheduled": 0, "numberAvailable": 0}))  # fmt: skip
