"""Mutant: the plugin writes its CDI spec once at start-up and never repairs it afterwards."""

from __future__ import annotations

import sys

from hv_device_plugin import __main__ as entry
from hv_device_plugin.cdi import CdiReconciler, CdiStatus

_original = CdiReconciler.reconcile
_calls = {"n": 0}


def _reconcile_once(self: CdiReconciler) -> CdiStatus:
    _calls["n"] += 1
    return _original(self) if _calls["n"] == 1 else self.inspect()


CdiReconciler.reconcile = _reconcile_once  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(entry.main())
