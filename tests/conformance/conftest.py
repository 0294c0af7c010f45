"""Fixtures of the conformance tests."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    # Short base path: unix socket paths are limited to 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="kem-"))
    try:
        yield base / "device-plugins"
    finally:
        shutil.rmtree(base, ignore_errors=True)
