"""The plugin half of a node whose plugin runs in a PluginSandbox, as far as it is the same on the
local node and the real node (realnode/sandboxed.py): its health observed through the profile's
probes, its process and what ran as the plugin read back from the kernel. Each node says how
its plugin's own socket is found and where its sandbox runs.
"""

from __future__ import annotations

import os
from pathlib import Path

from hvconform.contract.plugin import PluginUnderTest, Probe
from hvconform.contract.ran import PluginRan
from hvconform.targets.host.sandbox import PluginSandbox
from hvconform.targets.local.observe import Observer


class SandboxedPluginView:
    """Mixin of LocalNode and the real node's SandboxedPlugin (before their fault mixins)."""

    plugin: PluginUnderTest
    sandbox: PluginSandbox | None
    readiness: Observer
    liveness: Observer

    def _plugin_socket(self) -> Path | None:
        raise NotImplementedError

    def _sandbox(self) -> PluginSandbox:
        assert self.sandbox is not None, "the plugin was never started"
        return self.sandbox

    def _observer(self, probe: Probe) -> Observer:
        return Observer(
            self.plugin,
            probe,
            health_addr=lambda: self._sandbox().health_addr,
            socket=self._plugin_socket,
            pid=lambda: self._sandbox().pid,
        )

    def plugin_running(self) -> bool:
        """The plugin process is up (a hook: the container runtime asks its engine)."""
        return self.sandbox is not None and self.sandbox.running

    def plugin_live(self) -> bool:
        return self.liveness()

    def plugin_ready(self) -> bool:
        return self.readiness()

    def plugin_instance(self) -> str:
        return str(self._sandbox().pid)

    def plugin_cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self._sandbox().pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def _ran(self, place: str, *notes: str) -> PluginRan:
        """What runs as the plugin, read back from the kernel (the launcher exec'ed it: its pid
        is the plugin's): /proc/<pid>/cmdline and the executable, as the plugin's view names it;
        `place` says where its sandbox runs."""
        sandbox = self._sandbox()
        pid = sandbox.pid
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        if not raw:  # a zombie or a kernel thread has none: nothing ran that can be named
            raise RuntimeError(f"plugin pid {pid} has no command line (it exited)")
        args = raw.split(b"\0")
        args = args[:-1] if args[-1] == b"" else args  # NUL-terminated; an empty arg is kept
        exe = str(Path(f"/proc/{pid}/exe").readlink())
        stage = (sandbox.stage_root or "").rstrip("/")
        if stage and exe.startswith(stage + "/"):
            exe = exe[len(stage) :]  # the staged root is the plugin's /
        return PluginRan(
            how="process",
            argv=tuple(a.decode(errors="replace") for a in args),
            exe=exe,
            pid=pid,
            where=f"sandbox {sandbox.netns_name} {place}",
            notes=("own mount and network namespaces, zero capabilities, no_new_privs", *notes),
        )
