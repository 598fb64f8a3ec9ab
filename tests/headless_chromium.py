"""A headless Chromium driven through its DevTools protocol (CDP) over a websocket, for browser tests.

``find_chromium()`` locates the browser (``$TFM_CHROMIUM``, else Debian's ``chromium`` or
``chromium-headless-shell`` on PATH; ``make browser`` installs Debian's package). ``Browser`` starts
it with a fresh profile, every address but 127.0.0.1 unreachable (its host resolver maps any other
name or address to "not found": nothing leaves the machine) and Chromium's background services off,
attaches to its page and offers what a test does with a page: navigate, evaluate JavaScript, click,
type, press a key, wait for a condition; the network requests the page made are recorded
(``requests``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from websockets.sync.client import connect

#: Executables tried on PATH, in order.
NAMES = ("chromium", "chromium-headless-shell", "chromium-browser")

FLAGS = ("--headless", "--disable-gpu", "--no-first-run", "--no-default-browser-check", "--disable-extensions",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-domain-reliability", "--no-pings", "--mute-audio",
         "--disable-features=Translate,MediaRouter,OptimizationHints,AutofillServerCommunication",
         "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--window-size=1000,800", "--remote-debugging-port=0")


def find_chromium() -> str | None:
    """The Chromium executable: ``$TFM_CHROMIUM`` when set, else the first of ``NAMES`` on PATH; None if none."""
    given = os.environ.get("TFM_CHROMIUM")
    if given:
        return given
    return next((p for p in map(shutil.which, NAMES) if p), None)


class CDPError(RuntimeError):
    """A DevTools command answered with an error, or a page script threw."""


class Browser:
    """A headless Chromium with one page, driven over CDP (a context manager; ``close()`` ends it).

    Args:
        executable: the Chromium binary (``find_chromium()``).
        timeout: seconds to wait for the browser to start and for each command's answer.
    """

    def __init__(self, executable: str, timeout: float = 60.0):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="tfm-chromium-")
        self.log = open(Path(self.profile) / "stderr.log", "w+")
        flags = list(FLAGS) + (["--no-sandbox"] if os.geteuid() == 0 else [])  # root has no sandbox
        self.proc = subprocess.Popen([executable, *flags, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        self._id = 0
        self.events: list[dict] = []
        self._stack = ExitStack()  # the websocket, entered as a context manager (every websockets version)
        try:
            port = self._devtools_port()
            pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
            page = next(p for p in pages if p["type"] == "page")
            self.ws = self._stack.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None,
                                                        open_timeout=timeout))
            for domain in ("Page", "Runtime", "Network"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _devtools_port(self) -> int:
        """The port Chromium chose (its profile's DevToolsActivePort file, first line)."""
        path = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}: {self.stderr()}")
            if path.exists():
                lines = path.read_text().splitlines()
                if lines and lines[0].isdigit():
                    return int(lines[0])
            time.sleep(0.05)
        raise RuntimeError(f"chromium did not open its DevTools port in {self.timeout} s: {self.stderr()}")

    def stderr(self) -> str:
        """What the browser wrote to stderr so far (its last 4000 characters)."""
        self.log.flush()
        return Path(self.log.name).read_text()[-4000:]

    # -- the protocol ---------------------------------------------------------------------------
    def call(self, method: str, **params) -> dict:
        """Send one CDP command and return its ``result``; events that arrive meanwhile go to ``events``.

        Raises CDPError when the command fails, TimeoutError when no answer comes within ``timeout``.
        """
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to {method} in {self.timeout} s")
            msg = json.loads(self.ws.recv(timeout=left))
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise CDPError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    @property
    def requests(self) -> list[str]:
        """URLs of every request the page sent so far (``Network.requestWillBeSent``)."""
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    # -- a page ---------------------------------------------------------------------------------
    def goto(self, url: str) -> None:
        """Load ``url`` and wait until its document has loaded (``document.readyState`` complete)."""
        self.call("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited; JSON-able values).

        Raises CDPError when the expression throws."""
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise CDPError(f"{expression!r} threw: {d.get('exception', {}).get('description') or d.get('text')}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None, every: float = 0.05):
        """Poll a JavaScript expression until it is truthy; its value. Raises TimeoutError."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still false after {timeout or self.timeout} s")
            time.sleep(every)

    def click(self, selector: str) -> None:
        """A left mouse click at the centre of the element ``selector`` (as a user's: the browser hit-tests it).

        Raises CDPError when no element matches or it has no box."""
        box = self.js(f"(() => {{ const el = document.querySelector({json.dumps(selector)}); if (!el) return null;"
                      " el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
                      " return r.width && r.height ? [r.x + r.width / 2, r.y + r.height / 2] : null; })()")
        if box is None:
            raise CDPError(f"nothing to click at {selector!r}")
        x, y = box
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def type_text(self, text: str) -> None:
        """Type ``text`` into the focused element (``Input.insertText``: input events, as typing does)."""
        self.call("Input.insertText", text=text)

    def press_enter(self) -> None:
        """Press and release the Enter key in the focused element."""
        key = dict(key="Enter", code="Enter", windowsVirtualKeyCode=13, nativeVirtualKeyCode=13)
        self.call("Input.dispatchKeyEvent", type="keyDown", text="\r", **key)
        self.call("Input.dispatchKeyEvent", type="keyUp", **key)

    def close(self) -> None:
        """End the browser and remove its profile."""
        self._stack.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
