"""hvconform bench: the plugin's figures measured on a local node, against the seed's live figures.

`harness` builds the node (tmpfs CDI and host-dev views, kubelet emulator, the real plugin as a
subprocess), the `figures_*` modules measure, `report` renders bench.json and bench.md, `cli`
adds the `bench` subcommand. `reader` and `loadgen` run as separate processes.
"""

from __future__ import annotations
