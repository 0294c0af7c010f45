"""Kubernetes manifests for the plugin, rendered per target, and the policy they must meet."""

from __future__ import annotations

from hvconform.manifests.policy import RULES, Violation, check_policy
from hvconform.manifests.render import (
    DEFAULT_NAMESPACE,
    DEFAULT_POOL_TAINT,
    TARGETS,
    ManifestError,
    check_image,
    default_image,
    render_manifests,
    render_objects,
)

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_POOL_TAINT",
    "RULES",
    "TARGETS",
    "ManifestError",
    "Violation",
    "check_image",
    "check_policy",
    "default_image",
    "render_manifests",
    "render_objects",
]
