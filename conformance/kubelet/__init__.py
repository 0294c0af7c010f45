"""Kubelet device-manager emulator: registration server, plugin client, accounting."""

from __future__ import annotations

from .accounting import (
    Accounting,
    AllocationRecord,
    EventKind,
    PluginOptions,
    RegistrationRecord,
    ResourceState,
    TimelineEvent,
    WaitTimeout,
)
from .admission import (
    PHASE_FAILED,
    PHASE_PENDING,
    PHASE_RUNNING,
    REASON_ADMISSION,
    REASON_INSUFFICIENT,
    REASON_PRESTART,
    AllocationOutcome,
)
from .emulator import KubeletEmulator
from .loopthread import LoopThread
from .pods import ContainerRuntime, PodRecord
from .threaded import ThreadedKubeletEmulator
from .validation import is_extended_resource_name, resource_name_error, version_error

__all__ = [
    "PHASE_FAILED",
    "PHASE_PENDING",
    "PHASE_RUNNING",
    "REASON_ADMISSION",
    "REASON_INSUFFICIENT",
    "REASON_PRESTART",
    "Accounting",
    "AllocationOutcome",
    "AllocationRecord",
    "ContainerRuntime",
    "EventKind",
    "KubeletEmulator",
    "LoopThread",
    "PluginOptions",
    "PodRecord",
    "RegistrationRecord",
    "ResourceState",
    "ThreadedKubeletEmulator",
    "TimelineEvent",
    "WaitTimeout",
    "is_extended_resource_name",
    "resource_name_error",
    "version_error",
]
