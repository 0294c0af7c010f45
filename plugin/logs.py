"""Structured logs: one JSON object per line on stderr, with the fields an operator greps for."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_LOGGER = logging.getLogger("hv-device-plugin")
_FIELDS: dict[str, Any] = {}


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        if record.name != _LOGGER.name:
            entry["logger"] = record.name  # a library's record (grpc, asyncio)
        entry.update(_FIELDS)
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, sort_keys=False)


def setup(level: str, **static_fields: Any) -> None:
    """Route this process's logs to stderr as JSON lines; static fields go on every line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter())
    _LOGGER.handlers[:] = [handler]
    _LOGGER.setLevel(level.upper())
    _LOGGER.propagate = False
    # Libraries' warnings and errors too, so that stderr holds JSON lines only: without a
    # handler, logging's last resort would print their tracebacks as bare text.
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    _FIELDS.clear()
    _FIELDS.update(static_fields)


def log(event: str, level: int = logging.INFO, **fields: Any) -> None:
    _LOGGER.log(level, event, extra={"fields": fields})


def warn(event: str, **fields: Any) -> None:
    log(event, logging.WARNING, **fields)


def error(event: str, **fields: Any) -> None:
    log(event, logging.ERROR, **fields)
