"""Open a page in headless Chromium (Debian's ``chromium``) over the DevTools protocol.

:func:`open_page` starts a fresh browser (own profile folder, no sandbox, no GPU, no
background networking), loads a ``file://`` URL, collects console errors, uncaught exceptions
and every non-local request the page made, evaluates a JavaScript expression and takes a
full-page PNG screenshot. Protocol: https://chromedevtools.github.io/devtools-protocol/
(``Runtime.consoleAPICalled``, ``Runtime.exceptionThrown``, ``Log.entryAdded``,
``Network.requestWillBeSent``, ``Page.captureScreenshot``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import websocket

# Tests that open a page in Chromium are skipped, saying why, where Debian's chromium is missing.
needs_chromium = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)"
)

# A page check for plotly pages: per plot div, its size, the subplot titles and, per subplot, the
# line paths drawn (a "d" attribute longer than a bare move) and the markers.
PLOT_CHECK = """(() => {
  const out = {};
  for (const div of document.querySelectorAll('.plotly-graph-div')) {
    const subplots = {};
    for (const sp of div.querySelectorAll('g.cartesianlayer > g.subplot')) {
      const name = [...sp.classList].find(c => c !== 'subplot');
      const lines = [...sp.querySelectorAll('g.scatterlayer path.js-line')]
        .filter(p => (p.getAttribute('d') || '').length > 10).length;
      subplots[name] = {lines, points: sp.querySelectorAll('g.scatterlayer path.point').length};
    }
    const r = div.getBoundingClientRect();
    out[div.id] = {width: r.width, height: r.height, subplots,
                   titles: [...div.querySelectorAll('.annotation-text')].map(a => a.textContent)};
  }
  return out;
})()"""


FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    "--disable-default-apps", "--remote-debugging-port=0", "--window-size=1400,900",
]  # fmt: skip


def chromium() -> str | None:
    """Path of the Chromium binary, or ``None``."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class PageResult:
    value: Any  # what the evaluated expression returned (JSON)
    console_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    screenshot: bytes = b""


class _Session:
    def __init__(self, ws_url: str, timeout_s: float) -> None:
        self.ws = websocket.create_connection(ws_url, timeout=timeout_s, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, deadline: float) -> None:
        if any(e.get("method") == method for e in self.events):
            return
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            self.events.append(msg)
            if msg.get("method") == method:
                return
        raise TimeoutError(f"no {method} before the deadline")


def _devtools_port(profile: Path, proc: subprocess.Popen[bytes], deadline: float) -> int:
    path = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if path.exists() and (lines := path.read_text().splitlines()):
            return int(lines[0])
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        time.sleep(0.1)
    raise TimeoutError("chromium did not open its DevTools port")


def _errors(events: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    errors, external = [], []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errors.append(" ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
        elif method == "Runtime.exceptionThrown":
            details = p["exceptionDetails"]
            errors.append(details.get("exception", {}).get("description") or details["text"])
        elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
            errors.append(p["entry"]["text"])
        elif method == "Network.requestWillBeSent":
            url = p["request"]["url"]
            if not url.startswith(("file:", "data:", "blob:", "about:")):
                external.append(url)
    return errors, external


def open_page(
    url: str, expression: str, *, settle_s: float = 1.0, timeout_s: float = 60.0
) -> PageResult:
    """Load ``url``, wait for the load event plus ``settle_s``, evaluate ``expression`` (its
    value must be JSON-serialisable; a Promise is awaited) and screenshot the whole page.
    Raises ``RuntimeError``/``TimeoutError`` when Chromium fails or the page does not load."""
    binary = chromium()
    if binary is None:
        raise RuntimeError("chromium is not installed")
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="zw-chromium-") as profile:
        proc = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its helper processes go with it
        )
        try:
            port = _devtools_port(Path(profile), proc, deadline)
            pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            page = next(p for p in pages if p.get("type") == "page")
            s = _Session(page["webSocketDebuggerUrl"], timeout_s)
            for domain in ("Page", "Runtime", "Log", "Network"):
                s.call(f"{domain}.enable")
            s.call("Page.navigate", url=url)
            s.wait_event("Page.loadEventFired", deadline)
            time.sleep(settle_s)
            value = s.call(
                "Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True
            )
            metrics = s.call("Page.getLayoutMetrics")["cssContentSize"]
            s.call(
                "Emulation.setDeviceMetricsOverride", width=int(metrics["width"]),
                height=int(metrics["height"]), deviceScaleFactor=1, mobile=False,
            )  # fmt: skip
            time.sleep(0.5)
            shot = s.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            s.call("Runtime.evaluate", expression="0")  # drain events logged meanwhile
            s.ws.close()
            errors, external = _errors(s.events)
            if "exceptionDetails" in value:
                errors.append(f"evaluate: {value['exceptionDetails'].get('text')}")
            return PageResult(
                value=value.get("result", {}).get("value"),
                console_errors=errors,
                external_requests=external,
                screenshot=base64.b64decode(shot["data"]),
            )
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
