"""Errors of the run's inputs that the CLI turns into exit 2 with one line."""

from __future__ import annotations


class ProfileError(ValueError):
    """A profile that cannot be used; the message is one line naming the file and the key."""


class Unhonoured(ValueError):
    """A target cannot honour a field of the plugin under test: refused before anything runs
    (exit 2); the message names the field and the target."""
