"""Mutant: ListAndWatch always advertises every device Healthy, whatever the checks found."""

from __future__ import annotations

import sys

from hv_device_plugin import __main__ as entry
from hv_device_plugin.health import HealthState

HealthState.healthy = property(lambda self: True)  # type: ignore[assignment,method-assign]

if __name__ == "__main__":
    sys.exit(entry.main())
