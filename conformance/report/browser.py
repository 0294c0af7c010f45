"""Headless Chromium over the DevTools pipe: load a page, record every request, take a picture.

Used to prove report.html self-contained (no request leaves the page) and readable (a phone-sized
and a desktop screenshot). The browser cannot reach any network even if a page asked it to: all
host names resolve to nothing and every connection goes to a closed proxy port on loopback.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvconform.contract import settings

FLAGS = (
    "--headless",
    "--no-sandbox",  # root in CI; the page is our own file
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--proxy-server=http://127.0.0.1:9",  # discard port: nothing listens, nothing leaves
    "--proxy-bypass-list=<-loopback>",
    "--remote-debugging-pipe",
)
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")


class BrowserError(Exception):
    """Chromium is missing, died, or a wait on it expired (the message names the wait)."""


def find_chromium() -> str | None:
    """The browser to use: HV_CHROMIUM (the run's settings), else the first candidate on PATH."""
    forced = settings.current().chromium
    if forced:
        return forced if os.access(forced, os.X_OK) else None
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


@dataclass
class Page:
    """What one load of a page showed."""

    url: str
    dom: str
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    layout: dict[str, Any] = field(default_factory=dict)
    screenshot: bytes = b""
    pdf: bytes = b""  # the page as printed (print media), when asked for


def _high_pipe() -> tuple[int, int]:
    """A pipe whose ends are numbered 10 or above, so moving them onto fds 3 and 4 is safe."""
    ends = []
    for fd in os.pipe():
        ends.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        os.close(fd)
    return ends[0], ends[1]


class Chromium:
    """One browser process; use as a context manager. Messages are NUL-separated JSON."""

    def __init__(self, executable: str | None = None, timeout_s: float = 30.0) -> None:
        found = executable or find_chromium()
        if not found:
            raise BrowserError("chromium not found: apt-get install chromium (or set HV_CHROMIUM)")
        self.executable, self.timeout_s = found, timeout_s
        self._next_id = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Chromium:
        self._profile = tempfile.mkdtemp(prefix="hv-chromium-")
        to_browser_r, self._to_browser = _high_pipe()
        self._from_browser, from_browser_w = _high_pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4; bash moves our pipe ends
        # there, which avoids preexec_fn (unsafe with threads, and pytest-xdist has them).
        script = f'exec "$0" "$@" 3<&{to_browser_r} 4>&{from_browser_w} {to_browser_r}<&- {from_browser_w}>&-'
        argv = [*FLAGS, f"--user-data-dir={self._profile}", "about:blank"]
        self._proc = subprocess.Popen(
            ["bash", "-c", script, self.executable, *argv],
            pass_fds=(to_browser_r, from_browser_w),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.call("Browser.close", timeout_s=5)
        except BrowserError:
            pass  # it is killed below either way
        finally:
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._proc.stderr is not None:
                self._proc.stderr.close()
            os.close(self._to_browser)
            os.close(self._from_browser)
            shutil.rmtree(self._profile, ignore_errors=True)

    def _read(self, deadline: float, what: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"wait '{what}' expired after {self.timeout_s:g}s")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 16)
                if not chunk:
                    err = (
                        self._proc.stderr.read().decode(errors="replace")
                        if self._proc.stderr
                        else ""
                    )
                    raise BrowserError(f"chromium exited while waiting for {what}: {err[-800:]}")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str = "",
        timeout_s: float = 0,
    ) -> dict[str, Any]:
        """Send one command and wait for its answer; events that arrive meanwhile are kept."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            answer = self._read(deadline, f"answer to {method}")
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method} failed: {answer['error']}")
                result: dict[str, Any] = answer.get("result", {})
                return result
            self.events.append(answer)

    def wait_event(self, method: str, session: str) -> dict[str, Any]:
        def seen() -> dict[str, Any] | None:
            return next(
                (
                    e
                    for e in self.events
                    if e.get("method") == method and e.get("sessionId") == session
                ),
                None,
            )

        deadline = time.monotonic() + self.timeout_s
        while (event := seen()) is None:
            self.events.append(self._read(deadline, f"event {method}"))
        return event

    def load(
        self,
        url: str,
        *,
        width: int = 1280,
        height: int = 900,
        mobile: bool = False,
        pdf: bool = False,
    ) -> Page:
        """Open url in a fresh tab of the given viewport; DOM, requests, layout and a full PNG."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for method in ("Network.enable", "Page.enable", "Runtime.enable"):
            self.call(method, session=session)
        metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}
        self.call("Emulation.setDeviceMetricsOverride", metrics, session=session)
        nav = self.call("Page.navigate", {"url": url}, session=session)
        if nav.get("errorText"):
            raise BrowserError(f"navigation to {url} failed: {nav['errorText']}")
        self.wait_event("Page.loadEventFired", session)
        page = Page(url, self._eval(session, "document.documentElement.outerHTML"))
        page.layout = json.loads(self._eval(session, _LAYOUT))
        size = self.call("Page.getLayoutMetrics", session=session)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": width, "height": min(size["height"], 16000), "scale": 1}
        shot = self.call(
            "Page.captureScreenshot",
            {"format": "png", "clip": clip, "captureBeyondViewport": True},
            session=session,
        )
        page.screenshot = base64.b64decode(shot["data"])
        if pdf:
            printed = self.call("Page.printToPDF", {"printBackground": True}, session=session)
            page.pdf = base64.b64decode(printed["data"])
        page.requests = [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent" and e.get("sessionId") == session
        ]
        self.call("Target.closeTarget", {"targetId": target})
        return page

    def _eval(self, session: str, expression: str) -> str:
        answer = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=session
        )
        return str(answer["result"].get("value", ""))


# What a reader's eye depends on: no sideways scrolling of the page, and every SVG drawn.
_LAYOUT = """JSON.stringify({
  scrollWidth: document.documentElement.scrollWidth,
  innerWidth: window.innerWidth,
  svgs: Array.from(document.querySelectorAll('svg.timeline')).map(s => ({
    check: s.dataset.check, width: s.getBoundingClientRect().width,
    height: s.getBoundingClientRect().height})),
  scripts: document.scripts.length
})"""


def capture(html: Path, png: Path | None = None, **viewport: Any) -> Page:
    """Load a local HTML file once; write its screenshot to png when given."""
    with Chromium() as browser:
        page = browser.load(html.resolve().as_uri(), **viewport)
    if png is not None:
        png.parent.mkdir(parents=True, exist_ok=True)
        png.write_bytes(page.screenshot)
    return page
