"""Mutant: the plugin never notices that the kubelet ended its ListAndWatch stream, so it never
registers again: its devices stay unhealthy until a kubelet restart or a restart by hand
(kubevirt/kubevirt#2098, #6748)."""

from __future__ import annotations

import sys

from hv_device_plugin import __main__ as entry
from hv_device_plugin.registration import Registrar

Registrar._stream_lost = lambda self: False  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(entry.main())
