"""Optional RPCs, checked only when the plugin declares them in GetDevicePluginOptions.

A plugin that declares GetPreferredAllocation must answer it with devices it advertises, as
many as were asked, all distinct, and the kubelet then allocates exactly those; one that
requires PreStartContainer must let an admission through it. A plugin that declares neither is
not_applicable here, never passed.
"""

from __future__ import annotations

from hvconform.contract.node import (
    CAP_PLUGIN_OPTIONS,
    CAP_PRE_START,
    CAP_PREFERRED_ALLOCATION,
    Node,
    require,
)
from hvconform.contract.results import NotApplicable, Recorder
from hvconform.scenarios.common import fresh_guest, wait_ready


def optional_rpcs(node: Node, rec: Recorder) -> None:
    require(node, CAP_PLUGIN_OPTIONS)  # else what the plugin declares is not known here
    declared = {CAP_PREFERRED_ALLOCATION, CAP_PRE_START} & node.capabilities
    if not declared:
        raise NotApplicable(
            "the plugin declares neither GetPreferredAllocation nor PreStartContainer"
        )
    wait_ready(node, rec, "before allocation")
    allocation = node.allocate()
    try:
        assert allocation.ok, f"admission refused: {allocation.reason} {allocation.message}"
        if CAP_PREFERRED_ALLOCATION in declared:
            preferred = allocation.preferred
            assert preferred is not None, "GetPreferredAllocation was declared but not answered"
            assert len(preferred) == len(set(preferred)) == 1, f"preferred {preferred}: want 1 id"
            assert preferred == allocation.device_ids, (
                f"allocated {allocation.device_ids}, the plugin preferred {preferred}"
            )
            rec.note(f"GetPreferredAllocation answered {preferred}")
        if CAP_PRE_START in declared:
            rec.note("PreStartContainer required and answered before the container ran")
        rec.metric("declared", len(declared))
    finally:
        node.release(allocation)
    fresh_guest(node, rec, "optional RPCs")
