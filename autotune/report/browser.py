"""Open a report in a real headless Chromium and collect what a person would see go wrong: console
errors, uncaught exceptions, plots that did not draw. Spoken to over the DevTools protocol (a websocket,
through aiohttp, which autotune already depends on), because Chromium's own stderr logging prints
`console.error` and `console.log` alike and cannot tell them apart.

    python -m autotune.report.browser report.html --screenshot shot.png
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from autotune.engine.process import find_free_port, spawn, stop_group

LOCAL_SCHEMES = ("file:", "data:", "about:", "blob:")
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    return next((p for p in (shutil.which(c) for c in CANDIDATES) if p), None)


@dataclass
class PageCheck:
    errors: list[str] = field(default_factory=list)      # console errors, uncaught exceptions, network use
    plots: int = 0                                         # plotly graphs that drew
    title: str = ""
    text: str = ""                                         # the page's visible text


class _CDP:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse):
        self.ws = ws
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my = self.next_id
        await self.ws.send_str(json.dumps({"id": my, "method": method, "params": params}))
        while True:
            msg = json.loads((await self.ws.receive()).data)
            if msg.get("id") == my:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    async def drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                msg = await asyncio.wait_for(self.ws.receive(), left)
            except asyncio.TimeoutError:
                return
            if msg.type != aiohttp.WSMsgType.TEXT:
                return
            self.events.append(json.loads(msg.data))


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console." + p["type"] + ": " + " ".join(str(a.get("value", a.get("description", "")))
                                                               for a in p.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("exception: " + str((d.get("exception") or {}).get("description") or d.get("text")))
        elif method == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            out.append("log: " + p["entry"].get("text", ""))
        elif method == "Network.requestWillBeSent":
            url = p.get("request", {}).get("url", "")
            if not url.startswith(LOCAL_SCHEMES):
                out.append("network request while offline: " + url)
    return out


async def _check(port: int, url: str, screenshot: Path | None, width: int, height: int, scale: float) -> PageCheck:
    async with aiohttp.ClientSession() as http:
        targets: list[dict[str, Any]] = []
        for _ in range(100):
            try:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    targets = [t for t in await r.json() if t.get("type") == "page"]
                if targets:
                    break
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
        if not targets:
            raise RuntimeError("Chromium did not open its DevTools endpoint")
        async with http.ws_connect(targets[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = _CDP(ws)
            for domain in ("Runtime.enable", "Log.enable", "Page.enable", "Network.enable"):
                await cdp.call(domain)
            # the report must work offline: the page gets no network, and any request it tries is an error
            await cdp.call("Network.emulateNetworkConditions", offline=True, latency=0, downloadThroughput=-1,
                           uploadThroughput=-1)
            await cdp.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                           deviceScaleFactor=1, mobile=False)
            await cdp.call("Page.navigate", url=url)
            for _ in range(300):
                if any(e.get("method") == "Page.loadEventFired" for e in cdp.events):
                    break
                await cdp.drain(0.1)
            await cdp.drain(2.0)   # plotly draws after load
            res = await cdp.call("Runtime.evaluate", returnByValue=True, expression=(
                "JSON.stringify({plots: document.querySelectorAll('.js-plotly-plot .main-svg').length > 0 ?"
                " document.querySelectorAll('.js-plotly-plot').length : 0, title: document.title,"
                " text: document.body.innerText})"))
            info = json.loads(res["result"]["value"])
            if screenshot is not None:
                shot = await cdp.call("Page.captureScreenshot", format="png", clip=dict(
                    x=0, y=0, width=width, height=height, scale=scale))
                screenshot.write_bytes(base64.b64decode(shot["data"]))
            await cdp.drain(0.2)
            return PageCheck(_errors(cdp.events), int(info["plots"]), info["title"], info["text"])


def check_page(path: Path, screenshot: Path | None = None, width: int = 1280, height: int = 1800,
               scale: float = 0.5, timeout_s: float = 90) -> PageCheck:
    """Load `path` in headless Chromium (own process group, stopped by PID) and report what went wrong."""
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no Chromium found (Debian: apt-get install chromium)")
    port = find_free_port()
    with tempfile.TemporaryDirectory(prefix="autotune-chromium-") as profile:
        argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
                f"--user-data-dir={profile}", f"--remote-debugging-port={port}", "--remote-allow-origins=*",
                "about:blank"]
        proc = spawn(argv, Path(profile) / "chromium.log")
        try:
            return asyncio.run(asyncio.wait_for(_check(port, Path(path).resolve().as_uri(), screenshot, width,
                                                       height, scale), timeout_s))
        finally:
            stop_group(proc.pid, proc.pid, grace_s=5.0, popen=proc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autotune.report.browser", description=__doc__.split("\n")[0])
    p.add_argument("html")
    p.add_argument("--screenshot")
    args = p.parse_args(argv)
    res = check_page(Path(args.html), Path(args.screenshot) if args.screenshot else None)
    print(f"{res.title}: {res.plots} plot(s) drawn, {len(res.errors)} console error(s)")
    for e in res.errors:
        print("  " + e)
    return 1 if res.errors else 0


if __name__ == "__main__":
    sys.exit(main())
