"""The run context: every input of one run, validated once by the CLI and read typed by all.

`hvconform run` validates its options and the plugin profile, then writes this context as
`run-context.json` into the run's directory and hands pytest its path (`--context`). pytest, every
target family and the bench read the run's inputs only from here: nothing is taken from
environment variables, and the profile is never parsed again (the context holds the parsed
plugin under test, with its deploy section). A multi-node cluster run writes one context per
node, each with its own node, out dir and run id.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from hvconform.contract import settings as run_settings
from hvconform.contract.cluster_options import ClusterOptions
from hvconform.contract.plugin import PluginUnderTest
from hvconform.contract.safewrite import write_atomic
from hvconform.contract.target_options import LocalOptions, NodeOptions

FILE_NAME = "run-context.json"
# How a pytest worker finds the context its controller was given (xdist starts workers with the
# controller's environment; the path, not the inputs, travels there).
ENV_CONTEXT = "HV_RUN_CONTEXT"
SCHEMA = 2
# What a run may do to its node: "full", the whole catalogue (faults included) on a node the run
# may disturb; "validate", only the rows whose `validate` field is set, and a target that then
# disturbs nothing (scenarios.validate says what that subset reads).
MODES = ("full", "validate")
_O = TypeVar("_O", LocalOptions, NodeOptions, ClusterOptions)
# The chosen target's own options, typed: one object per run, of its family's class.
TargetOptions = LocalOptions | NodeOptions | ClusterOptions
_FAMILIES: dict[str, type[LocalOptions] | type[NodeOptions] | type[ClusterOptions]] = {
    c.FAMILY: c for c in (LocalOptions, NodeOptions, ClusterOptions)
}


@dataclass(frozen=True)
class RunContext:
    run_id: str
    out_dir: str
    target: str
    plugin: PluginUnderTest
    recovery_timeout_s: float = 60.0
    markexpr: str = ""
    workers: str = "0"
    mode: str = "full"  # one of MODES
    # the target's own options (its flags, typed by its family's options module)
    options: TargetOptions = field(default_factory=LocalOptions)
    # what the user set by environment variable, read once by the CLI (contract.settings)
    settings: run_settings.RunSettings = field(default_factory=run_settings.RunSettings)

    @property
    def cluster(self) -> ClusterOptions | None:
        """The cluster targets' options; None on the others."""
        return self.options if isinstance(self.options, ClusterOptions) else None

    def options_of(self, family: type[_O]) -> _O:
        """The target's options as `family` (its defaults when the run's target is another
        family's: a check of the local family asked on a node run, say)."""
        return self.options if isinstance(self.options, family) else family()

    @property
    def runtime(self) -> str:
        """How the plugin and workloads run on the local target ("process" everywhere else)."""
        return self.options.runtime if isinstance(self.options, LocalOptions) else "process"

    @property
    def out(self) -> Path:
        return Path(self.out_dir)

    def with_(self, **changes: Any) -> RunContext:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "run_id": self.run_id,
            "out_dir": self.out_dir,
            "target": self.target,
            "plugin": self.plugin.to_json(),
            "recovery_timeout_s": self.recovery_timeout_s,
            "markexpr": self.markexpr,
            "workers": self.workers,
            "mode": self.mode,
            "options": {"family": self.options.FAMILY, **self.options.to_json()},
            "settings": self.settings.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunContext:
        if data.get("schema") != SCHEMA:
            raise ValueError(f"run context schema {data.get('schema')!r}, want {SCHEMA}")
        options = dict(data["options"])
        family = _FAMILIES.get(str(options.pop("family", "")))
        if family is None:
            raise ValueError(f"run context: unknown options family in {sorted(data['options'])}")
        return cls(
            run_id=data["run_id"],
            out_dir=data["out_dir"],
            target=data["target"],
            plugin=PluginUnderTest.from_json(data["plugin"]),
            recovery_timeout_s=float(data["recovery_timeout_s"]),
            markexpr=data["markexpr"],
            workers=data["workers"],
            mode=str(data.get("mode", "full")),
            options=family.from_json(options),
            settings=run_settings.RunSettings.from_json(data.get("settings", {})),
        )

    def write(self, path: Path | None = None) -> Path:
        """Write the context (atomically) into the run dir, or `path`; returns where."""
        dest = path or self.out / FILE_NAME
        return write_atomic(dest, json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n")


def read(path: Path | str) -> RunContext:
    return RunContext.from_json(json.loads(Path(path).read_text()))


_CURRENT: list[RunContext] = []


def current() -> RunContext:
    """The context of the run this process belongs to (a pytest controller or worker)."""
    if not _CURRENT:
        path = os.environ.get(ENV_CONTEXT, "")
        if not path:
            raise RuntimeError(f"no run context: hvconform run writes one ({ENV_CONTEXT} unset)")
        _CURRENT.append(read(path))
        run_settings.install(_CURRENT[0].settings)  # the CLI's reading, not the environment's
    return _CURRENT[0]


def install(ctx: RunContext, path: Path) -> None:
    """Make `ctx` this process's context and let its children (xdist workers) find it."""
    _CURRENT[:] = [ctx]
    run_settings.install(ctx.settings)
    os.environ[ENV_CONTEXT] = str(path)
