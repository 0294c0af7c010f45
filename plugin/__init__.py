"""Reference Kubernetes device plugin for hypervisor devices (/dev/kvm, /dev/mshv)."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # Lazy: `import hv_device_plugin` stays cheap (the SIGTERM handler must come before slow imports),
    # and the version is read from package metadata, where pyproject.toml defines it once.
    if name == "__version__":
        from hv_device_plugin.version import version

        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
