"""Kubernetes resource quantities as the API server serialises them ("2k" is 2000 devices).

Defined once here, where the real node and the cluster targets meet: both read a device count
out of a Node's capacity and allocatable.
"""

from __future__ import annotations

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_SUFFIX |= {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(text: str) -> int:
    """A whole-number quantity: digits and an optional decimal or binary suffix."""
    digits = text.rstrip("kKMGTPEi")
    return int(digits) * _SUFFIX[text[len(digits) :]]
