"""Reference Kubernetes device plugin for hypervisor devices (/dev/kvm, /dev/mshv)."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # Lazy: `import plugin` stays cheap (the SIGTERM handler must come before slow imports),
    # and the version is read from package metadata, where pyproject.toml defines it once.
    if name == "__version__":
        from plugin.version import version

        return version()
    raise AttributeError(f"module 'plugin' has no attribute {name!r}")
