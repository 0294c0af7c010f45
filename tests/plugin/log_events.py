"""The plugin's log events as a test sees them: each (event, fields) the plugin logged.

A handler on the plugin's own logger, not pytest's caplog: hv_device_plugin.logs.setup (run by any
in-process entry point) stops propagation to the root logger, which caplog listens on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Events(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.getMessage(), dict(getattr(record, "fields", {}))))

    def named(self, event: str) -> list[dict[str, Any]]:
        return [fields for name, fields in self.seen if name == event]


@contextmanager
def plugin_events() -> Iterator[Events]:
    logger = logging.getLogger("hv-device-plugin")
    events, level = Events(), logger.level
    logger.addHandler(events)
    logger.setLevel(logging.DEBUG)
    try:
        yield events
    finally:
        logger.removeHandler(events)
        logger.setLevel(level)
