"""Console entry point: a SIGTERM handler first, then the (slow) imports of the plugin.

As PID 1 in a container SIGTERM is ignored until a handler exists, and importing grpc takes a
while: a stop during start-up must still end the process at once. Only the program installs this
handler; modules that import hv_device_plugin.__main__ (tests, probes) keep their own signal handling.
"""

from __future__ import annotations

import signal
import sys


def exit_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def main() -> int:
    exit_on_sigterm()
    from hv_device_plugin.__main__ import main as run_plugin

    return run_plugin()
