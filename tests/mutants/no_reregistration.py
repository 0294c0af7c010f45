"""Mutant: the plugin never notices a kubelet restart and so never registers again."""

from __future__ import annotations

import sys

from hv_device_plugin import __main__ as entry
from hv_device_plugin.registration import Registrar

Registrar._restart_needed = lambda self: ""  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(entry.main())
