"""PID 1 of a cluster-mode node: its mounts, its containerd, its kubelet kept running.

`node-up --nodes N` starts each node as `unshare --pid --mount --mount-proc --fork` running this
module, so a node is what a kind node container or a VM is to the pods on it: its own PID
namespace (a hostPID pod sees this process as PID 1, and `nsenter -t 1` enters the node, as on
AKS), its own mount namespace (its own /var/lib/kubelet and CDI dir: two kubelets on one machine
never share a plugin directory), and an init that does what systemd does for a kubelet:

    SIGHUP             graceful restart of the kubelet (SIGTERM, wait, start again)
    kubelet exits      started again after RESTART_DELAY_S (Restart=always): a crash is a kill -9,
                       unless SELF/kubelet.hold exists (a stopped kubelet, until it is removed)
    SIGTERM / SIGINT   kubelet stopped, every pod removed through CRI, containerd stopped; when
                       this process exits the kernel ends whatever is left in the namespace

What the node's own tools read is in its run dir, seen inside the node at SELF: kubelet.pid (the
PID inside the node), kubelet.log (each line prefixed with the wall-clock time it was written,
so registration times need no log-format parsing), restarts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hvconform.contract.nodeinit import HOLD_FILE

RESTART_DELAY_S = 0.5
STOP_TIMEOUT_S = 20.0


class Init:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.run = Path(spec["run"])
        self.kubelet: subprocess.Popen[bytes] | None = None
        self.containerd: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.restart_requested = False
        self.exited_at: float | None = None
        self.restarts = 0

    # -- signals --------------------------------------------------------------------------

    def install(self) -> None:
        signal.signal(signal.SIGHUP, lambda s, f: setattr(self, "restart_requested", True))
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda s, f: setattr(self, "stopping", True))

    # -- processes ------------------------------------------------------------------------

    def mounts(self) -> None:
        for kind, source, target in self.spec["mounts"]:
            Path(target).mkdir(parents=True, exist_ok=True)
            argv = ["mount", "--bind", source, target]
            if kind == "tmpfs":
                argv = ["mount", "-t", "tmpfs", "-o", f"size={source},mode=0755", "hv-node", target]
            subprocess.run(argv, check=True)

    def start_containerd(self) -> None:
        log = (self.run / "containerd.log").open("ab")
        self.containerd = subprocess.Popen(
            self.spec["containerd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
        log.close()
        socket = Path(self.spec["socket"])
        deadline = time.monotonic() + 60
        while not socket.exists():
            if self.containerd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start (exit {self.containerd.poll()})")
            time.sleep(0.1)

    def start_kubelet(self) -> None:
        proc = subprocess.Popen(
            self.spec["kubelet"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert proc.stdout is not None
        threading.Thread(target=_stamp_lines, args=(proc.stdout, self.run), daemon=True).start()
        self.kubelet = proc
        _write(self.run / "kubelet.pid", f"{proc.pid}\n")
        _write(self.run / "restarts", f"{self.restarts}\n")

    def stop_kubelet(self) -> None:
        if self.kubelet is not None and self.kubelet.poll() is None:
            self.kubelet.terminate()
            try:
                self.kubelet.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kubelet.kill()
                self.kubelet.wait()

    def reap(self) -> None:
        """PID 1 adopts every orphan (containerd's shims among them): collect them all."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for proc in (self.kubelet, self.containerd):
                if proc is not None and proc.pid == pid and proc.returncode is None:
                    proc.returncode = -1  # reaped here; Popen must not wait for it again

    def loop(self) -> None:
        while not self.stopping:
            time.sleep(0.05)
            self.reap()
            if self.restart_requested:
                self.restart_requested = False
                self.stop_kubelet()
                self.restarts += 1
                self.start_kubelet()
                continue
            if self.kubelet is not None and self.kubelet.poll() is not None:
                if (self.run / HOLD_FILE).exists():
                    self.exited_at = None  # held stopped: the delay counts from the release
                    continue
                now = time.monotonic()
                self.exited_at = self.exited_at or now
                if now - self.exited_at >= RESTART_DELAY_S:
                    self.exited_at = None
                    self.restarts += 1
                    self.start_kubelet()

    def shutdown(self) -> None:
        self.stop_kubelet()
        if self.containerd is not None and self.containerd.poll() is None:
            subprocess.run([*self.spec["crictl"], "rmp", "-af"], capture_output=True, timeout=120)
            self.containerd.terminate()
            try:
                self.containerd.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.containerd.kill()


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _stamp_lines(stream: Any, run: Path) -> None:
    with (run / "kubelet.log").open("ab", buffering=0) as log:
        for line in iter(stream.readline, b""):
            log.write(f"{time.time():.6f} ".encode() + line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hv-node-init")
    parser.add_argument("spec", type=Path, help="the node's spec.json (written by `nodes`)")
    args = parser.parse_args(argv)
    init = Init(json.loads(args.spec.read_text()))
    init.install()
    try:
        init.mounts()
        init.start_containerd()
        init.start_kubelet()
        _write(init.run / "ready", "1\n")
        init.loop()
    except Exception as exc:  # the node's one line for node-up, whatever went wrong
        _write(init.run / "failed", f"{type(exc).__name__}: {exc}\n")
        print(f"hv-node-init: {exc}", file=sys.stderr)
        return 1
    finally:
        init.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
