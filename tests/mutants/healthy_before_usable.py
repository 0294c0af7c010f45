"""Mutant: the first device check after start trusts the device node it finds (identity only,
no usability probe), so after a reboot the plugin advertises its devices healthy before the
hypervisor is usable; later checks (and every Allocate) probe as usual."""

from __future__ import annotations

import sys

from hv_device_plugin import __main__ as entry
from hv_device_plugin.device import CheckResult, check_host_entry
from hv_device_plugin.monitor import Monitor

_checked: set[int] = set()
_original = Monitor._run_device_check


async def _first_check_trusts_the_node(self: Monitor) -> CheckResult:
    host = self._cfg.host_view_path
    if id(self) not in _checked and host is not None:
        _checked.add(id(self))
        result = check_host_entry(str(host))
        if result.ok:
            self._health.set_device(True, "")
            return result
    return await _original(self)


Monitor._run_device_check = _first_check_trusts_the_node  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(entry.main())
