"""Mutant DRA driver: it creates its ResourceSlice once per process and never again. While the
slice exists it is updated as usual (taints come and go); once the kubelet wiped it at its
start (dra_plugin_manager.go), it is never published back."""

from __future__ import annotations

import sys
from typing import Any

from hv_device_plugin import __main__ as entry
from hv_device_plugin.dra.kubeapi import ApiError, KubeApi

_request = KubeApi.request
_created: list[bool] = []


def _request_once(self: KubeApi, method: str, path: str, body: Any = None) -> Any:
    creating = method == "POST" and path.endswith("/resourceslices")
    if creating and _created:
        raise ApiError(409, "mutant: the slice is created once per process")
    result = _request(self, method, path, body)
    if creating:
        _created.append(True)
    return result


KubeApi.request = _request_once  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(entry.main())
