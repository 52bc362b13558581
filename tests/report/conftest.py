"""A real headless Chromium, driven over the DevTools protocol (websocket-client).

``chromium_page(path)`` loads a local file with console, exception, log and network
capture on, waits for the page to say it is ready, and returns a ``PageResult`` with the
errors seen, every non-local request, an ``evaluate`` function, and a screenshot saver.
Chromium is killed by PID (and its process group) in ``finally``.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--hide-scrollbars"]


@dataclasses.dataclass
class PageResult:
    console_errors: list[str]
    external_requests: list[str]
    ready: str | None
    evaluate: Callable[[str], Any]
    screenshot: Callable[..., Path]


class _CDP:
    def __init__(self, ws_url: str) -> None:
        import websocket  # websocket-client (dev extra)

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        mid = next(self.ids)
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params}))
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(method)

    def pump(self, seconds: float) -> None:
        self.ws.settimeout(seconds)
        try:
            while True:
                msg = json.loads(self.ws.recv())
                if "method" in msg:
                    self.events.append(msg)
        except Exception:  # noqa: BLE001 - websocket timeout ends the pump
            pass
        finally:
            self.ws.settimeout(30)


def _errors(events: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    errs, ext = [], []
    for e in events:
        m, p = e["method"], e.get("params", {})
        if m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            errs.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description"))) for a in p.get("args", [])))
        elif m == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            errs.append("exception: " + str(d.get("exception", {}).get("description") or d.get("text")))
        elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            errs.append("log: " + p["entry"].get("text", ""))
        elif m == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if not url.startswith(("file:", "data:", "blob:", "about:")):
                ext.append(url)
    return errs, ext


@contextlib.contextmanager
def chromium_session(workdir: Path) -> Iterator[Callable[..., PageResult]]:
    """Yield ``load(page) -> PageResult``; every Chromium started is killed on exit."""
    if CHROMIUM is None:
        raise RuntimeError("chromium is not installed")
    procs: list[subprocess.Popen] = []
    conns: list[_CDP] = []

    def load(page: Path, ready_timeout: float = 60.0, width: int = 1400) -> PageResult:
        profile = Path(tempfile.mkdtemp(prefix="chromium-profile-", dir=workdir))
        proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--window-size={width},1000", f"--user-data-dir={profile}",
                                 "--remote-debugging-port=0", "about:blank"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        procs.append(proc)
        port_file = profile / "DevToolsActivePort"
        end = time.monotonic() + 30
        while not (port_file.is_file() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > end:
                raise RuntimeError(f"chromium did not open its DevTools port (exit {proc.poll()})")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page_t = next(t for t in targets if t.get("type") == "page")
        cdp = _CDP(page_t["webSocketDebuggerUrl"])
        conns.append(cdp)
        for dom in ("Runtime", "Log", "Network", "Page"):
            cdp.call(f"{dom}.enable")
        cdp.call("Page.navigate", url=page.resolve().as_uri())
        ready = None
        end = time.monotonic() + ready_timeout
        while time.monotonic() < end:
            r = cdp.call("Runtime.evaluate", expression="document.body && document.body.dataset.ready || null",
                         returnByValue=True)
            ready = r.get("result", {}).get("value")
            if ready:
                break
            time.sleep(0.2)
        cdp.pump(0.5)  # late console messages

        def evaluate(expr: str) -> Any:
            r = cdp.call("Runtime.evaluate", expression=expr, returnByValue=True)
            if "exceptionDetails" in r:
                raise RuntimeError(f"{expr}: {r['exceptionDetails']}")
            return r.get("result", {}).get("value")

        def screenshot(out: Path, selector: str | None = None) -> Path:
            if selector:  # just one element
                r = evaluate(f"(() => {{ const b = document.querySelector({json.dumps(selector)})"
                             ".getBoundingClientRect(); return [b.x + scrollX, b.y + scrollY, b.width, b.height]; })()")
                clip = {"x": r[0], "y": r[1], "width": r[2], "height": r[3], "scale": 1}
            else:
                m = cdp.call("Page.getLayoutMetrics")
                size = m.get("cssContentSize") or m["contentSize"]
                clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
            shot = cdp.call("Page.captureScreenshot", format="png", captureBeyondViewport=True, clip=clip)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(base64.b64decode(shot["data"]))
            return out

        errs, ext = _errors(cdp.events)
        return PageResult(console_errors=errs, external_requests=ext, ready=ready, evaluate=evaluate,
                          screenshot=screenshot)

    try:
        yield load
    finally:
        for c in conns:
            try:
                c.ws.close()
            except Exception:  # noqa: BLE001
                pass
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # renderer/zygote children share the group
            except (ProcessLookupError, PermissionError):
                pass
            p.wait(timeout=5)


@pytest.fixture
def chromium_page(tmp_path: Path) -> Iterator[Callable[..., PageResult]]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    with chromium_session(tmp_path) as load:
        yield load
