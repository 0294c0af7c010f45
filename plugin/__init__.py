"""Reference Kubernetes device plugin for hypervisor devices (/dev/kvm, /dev/mshv)."""

__version__ = "0.1.0"
