"""Mutant DRA driver: each claim's CDI spec is written at NodePrepareResources and never
repaired afterwards (the monitor only inspects)."""

from __future__ import annotations

import sys

from plugin import __main__ as entry
from plugin.dra.claim_specs import ClaimSpecs

ClaimSpecs.reconcile = ClaimSpecs.inspect  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(entry.main())
