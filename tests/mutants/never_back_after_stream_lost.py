"""Mutant: once the kubelet ends its ListAndWatch stream, the plugin never registers again, not
even after a restart. It remembers the loss in the file HV_MUTANT_STATE names (as a plugin
keeping a bad state on its host path would) and, started with that file present, serves but
never registers: a node it leaves so cannot be restored, and every check after it must end
`blocked`, never failed (issue 35)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hv_device_plugin import __main__ as entry
from hv_device_plugin.registration import Registrar

STATE = Path(os.environ["HV_MUTANT_STATE"])
LOST = [STATE.exists()]  # read at start; set again when this process loses its stream
_lost = Registrar._stream_lost
_register = Registrar._register_with_backoff


def _stream_lost(self: Registrar) -> bool:
    if _lost(self):
        LOST[0] = True
        STATE.write_text("stream lost\n")
    return False  # and never registers again while it runs


async def _register_with_backoff(self: Registrar) -> bool:
    if LOST[0]:
        self._health.set_registered(False, "mutant: never registers after a lost stream")
        return False
    return await _register(self)


Registrar._stream_lost = _stream_lost  # type: ignore[method-assign]
Registrar._register_with_backoff = _register_with_backoff  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(entry.main())
