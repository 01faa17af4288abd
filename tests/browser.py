"""A real browser for tests: headless Chromium driven over the Chrome DevTools Protocol.

`Browser` starts Chromium (an argv list, a throwaway profile), talks to its page over the
DevTools websocket (websocket-client, nothing else), and takes it all down on leaving the
`with`, also on an exception: no browser process outlives it. While any command waits for
its reply, the events that arrive in between are read too, and the page's errors
(uncaught exceptions, console.error/assert, the browser's own error log) are kept in
`errors`. A test opens a page, evaluates JavaScript in it, clicks with the real mouse
(Input.dispatchMouseEvent at the element's centre), and takes a screenshot that
`not_blank` checks for a drawing.

    with Browser() as browser:
        browser.open(page.as_uri())
        browser.click("#next")
        assert browser.evaluate("document.title") == "run 1" and browser.errors == []
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket
from PIL import Image

# executables that speak the DevTools protocol, in the order they are looked for on PATH
BROWSERS = ("chromium", "chromium-browser", "chromium-headless-shell", "google-chrome")
START_TIMEOUT_S = 30      # the browser writes DevToolsActivePort and lists its page
STOP_TIMEOUT_S = 5        # SIGTERM, then SIGKILL
STDERR_TAIL_BYTES = 2000  # what an error message quotes of the browser's stderr
ERROR_CONSOLE_TYPES = ("error", "assert")
PR_SET_CHILD_SUBREAPER = 36   # prctl(2): orphaned descendants are reparented to us
PR_GET_CHILD_SUBREAPER = 37


class BrowserError(RuntimeError):
    """The browser did not start, a command failed or timed out, or the page threw."""


def chromium_path() -> str | None:
    """The first DevTools-capable browser on PATH (BROWSERS' order), or None."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def skip_reason() -> str | None:
    """None when a browser is found, else why the browser tests skip and what to install."""
    if chromium_path() is not None:
        return None
    return "no chromium on PATH: scripts/setup.sh installs Debian's chromium"


def not_blank(png_path: str | os.PathLike, min_colours: int = 9) -> bool:
    """True when the image has at least `min_colours` distinct colours over a copy at most
    256 px wide: a drawing has edges and fills; a blank or single-colour page has one."""
    with Image.open(png_path) as image:
        small = image.convert("RGB")
    small.thumbnail((256, 256))
    colours = small.getcolors(maxcolors=min_colours)   # None: more than that many
    return colours is None or len(colours) >= min_colours


def _describe_exception(details: dict) -> str:
    """One line for a Runtime.ExceptionDetails: the message, then where it was thrown."""
    exception = details.get("exception") or {}
    message = exception.get("description") or exception.get("value") or details.get("text", "")
    message = str(message).splitlines()[0] if message else details.get("text", "exception")
    where = details.get("url", "")
    if where:
        where = f" ({where}:{details.get('lineNumber', 0) + 1})"
    return f"{details.get('text', 'Uncaught')}: {message}{where}"


def _describe_remote(obj: dict) -> str:
    """A console argument (Runtime.RemoteObject) as console would print it."""
    if "value" in obj:
        return str(obj["value"])
    return str(obj.get("description") or obj.get("unserializableValue") or obj.get("type"))


class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol (a context
    manager: leaving it closes the websocket, stops the browser and removes its profile)."""

    def __init__(self, width_px: int = 1280, height_px: int = 800) -> None:
        self.width_px = width_px
        self.height_px = height_px
        self.errors: list[str] = []
        self.process: subprocess.Popen | None = None
        self.marker = ""         # the temporary folder, in its processes' command lines
        self._tmp: Path | None = None
        self._stderr = None
        self._ws: websocket.WebSocket | None = None
        self._next_id = 0
        self._loaded: set[str] = set()   # the loaderIds whose document fired its load event
        self._was_subreaper: bool | None = None

    # -- start and stop ------------------------------------------------------------------
    def __enter__(self) -> Browser:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        path = chromium_path()
        if path is None:
            raise BrowserError(skip_reason())
        self._tmp = Path(tempfile.mkdtemp(prefix="aft-browser-"))
        self.marker = str(self._tmp)
        profile = self._tmp / "profile"
        profile.mkdir()
        # HOME and the XDG folders in the temporary folder too: nothing is written to the
        # user's home (the crash handler's database), and every process that is given one
        # of them carries the folder in its command line, which close() looks for
        env = {**os.environ, "HOME": str(self._tmp), "XDG_CONFIG_HOME": str(self._tmp / "config"),
               "XDG_CACHE_HOME": str(self._tmp / "cache")}
        argv = [path, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions",
                "--remote-debugging-port=0", f"--user-data-dir={profile}",
                f"--window-size={self.width_px},{self.height_px}", "about:blank"]
        self._stderr = (self._tmp / "stderr.log").open("wb")
        # the browser's helpers that outlive it are reparented to this process, which reaps
        # them on close() (else they wait as zombies for init to reap them)
        self._was_subreaper = _set_subreaper(True)
        # its own process group: close() signals the browser and every helper it started
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=self._stderr,
                                        env=env, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        port = self._wait_for_port(profile / "DevToolsActivePort", deadline)
        url = self._page_websocket(port, deadline)
        # no Origin header: the browser refuses websockets from origins it was not told of
        self._ws = websocket.create_connection(url, timeout=START_TIMEOUT_S,
                                               suppress_origin=True,
                                               http_no_proxy=["127.0.0.1"])
        for domain in ("Runtime", "Page", "Log"):
            self.send(f"{domain}.enable")
        # Page.lifecycleEvent "load" is Page.loadEventFired with the navigation's loaderId:
        # open() waits for its own navigation's, not a late one of an earlier page
        self.send("Page.setLifecycleEventsEnabled", {"enabled": True})

    def pids(self) -> list[int]:
        """The browser's live processes (see browser_processes)."""
        if self.process is None:
            return []
        return browser_processes(self.process.pid, self.marker)

    def _stderr_tail(self) -> str:
        if self._tmp is None or not (self._tmp / "stderr.log").exists():
            return ""
        data = (self._tmp / "stderr.log").read_bytes()[-STDERR_TAIL_BYTES:]
        return data.decode(errors="replace").strip()

    def _wait_for_port(self, port_file: Path, deadline: float) -> int:
        """The port the browser chose (DevToolsActivePort's first line, once written)."""
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrowserError(f"{self.process.args[0]} exited with code "
                                   f"{self.process.returncode} before it listened; "
                                   f"its stderr ends:\n{self._stderr_tail()}")
            try:
                first, newline, _ = port_file.read_text().partition("\n")
            except FileNotFoundError:
                first, newline = "", ""
            if newline and first.strip().isdigit():
                return int(first)
            time.sleep(0.05)
        raise BrowserError(f"{self.process.args[0]} wrote no {port_file.name} within "
                           f"{START_TIMEOUT_S} s; its stderr ends:\n{self._stderr_tail()}")

    def _page_websocket(self, port: int, deadline: float) -> str:
        """The page target's websocket address, from /json/list."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            with opener.open(f"http://127.0.0.1:{port}/json/list", timeout=5) as reply:
                targets = json.load(reply)
            for target in targets:
                if target.get("type") == "page" and target.get("webSocketDebuggerUrl"):
                    return target["webSocketDebuggerUrl"]
            if time.monotonic() >= deadline:
                raise BrowserError(f"the browser lists no page target: {targets}")
            time.sleep(0.05)

    def close(self) -> None:
        """Close the websocket, stop the browser's process group, remove the profile."""
        if self._ws is not None:
            try:
                self._ws.close()
            except (OSError, websocket.WebSocketException):
                pass
            self._ws = None
        try:
            if self.process is not None:
                _stop(self.process, self.marker)
        finally:
            if self._was_subreaper is not None:
                _set_subreaper(self._was_subreaper)
                self._was_subreaper = None
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = None

    # -- the protocol --------------------------------------------------------------------
    def send(self, method: str, params: dict | None = None, timeout_s: float = 30) -> dict:
        """Send one command and return its result; the events that arrive before its reply
        (the message with its id) are handled on the way."""
        if self._ws is None:
            raise BrowserError(f"{method}: the browser is not running")
        self._next_id += 1
        command_id = self._next_id
        self._ws.send(json.dumps({"id": command_id, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout_s
        while True:
            message = self._receive(deadline, f"the reply to {method}")
            if message.get("id") == command_id:
                if "error" in message:
                    error = message["error"]
                    detail = f" ({error['data']})" if error.get("data") else ""
                    raise BrowserError(f"{method}: {error.get('message')}{detail}")
                return message.get("result", {})
            self._on_event(message)

    def _receive(self, deadline: float, waiting_for: str) -> dict:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise BrowserError(f"timed out waiting for {waiting_for}")
        self._ws.settimeout(remaining_s)
        try:
            return json.loads(self._ws.recv())
        except websocket.WebSocketTimeoutException:
            raise BrowserError(f"timed out waiting for {waiting_for}") from None
        except websocket.WebSocketConnectionClosedException:
            raise BrowserError(f"the browser closed its websocket while waiting for "
                               f"{waiting_for}; its stderr ends:\n{self._stderr_tail()}"
                               ) from None

    def _on_event(self, message: dict) -> None:
        method = message.get("method")
        params = message.get("params", {})
        if method == "Page.lifecycleEvent" and params.get("name") == "load":
            self._loaded.add(params.get("loaderId", ""))
        elif method == "Runtime.exceptionThrown":
            self.errors.append(_describe_exception(params.get("exceptionDetails", {})))
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ERROR_CONSOLE_TYPES:
            text = " ".join(_describe_remote(a) for a in params.get("args", []))
            self.errors.append(f"console.{params['type']}: {text}")
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            url = entry.get("url", "")
            if entry.get("level") == "error" and not url.endswith("/favicon.ico"):
                self.errors.append(f"log: {entry.get('text', '')}"
                                   + (f" ({url})" if url else ""))

    # -- what a test does ----------------------------------------------------------------
    def open(self, url: str, timeout_s: float = 30) -> None:
        """Navigate the page to url and wait for the new document's load event (a
        navigation within the document, to a #fragment, has none: it returns at once)."""
        deadline = time.monotonic() + timeout_s
        result = self.send("Page.navigate", {"url": url}, timeout_s)
        if result.get("errorText"):
            raise BrowserError(f"cannot open {url}: {result['errorText']}")
        loader = result.get("loaderId")
        while loader and loader not in self._loaded:
            self._on_event(self._receive(deadline, f"the load event of {url}"))

    def evaluate(self, expr: str, timeout_s: float = 30) -> Any:
        """The value of a JavaScript expression in the page (a promise is awaited); raises
        BrowserError with the exception's text if it threw."""
        result = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                                "awaitPromise": True}, timeout_s)
        if "exceptionDetails" in result:
            raise BrowserError(f"evaluate({expr!r}) threw "
                               f"{_describe_exception(result['exceptionDetails'])}")
        return result.get("result", {}).get("value")

    def wait_for(self, expr: str, timeout_s: float = 10, interval_s: float = 0.05) -> Any:
        """Evaluate expr until its value is truthy and return that value."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expr)
            if value:
                return value
            if time.monotonic() >= deadline:
                raise BrowserError(f"{expr!r} still {value!r} after {timeout_s} s")
            time.sleep(interval_s)

    def click(self, selector: str) -> tuple[float, float]:
        """A real left click at the centre of the first element matching selector
        (scrolled into view first); returns the point clicked, in CSS px."""
        box = self.evaluate(f"""(() => {{
            const element = document.querySelector({json.dumps(selector)});
            if (!element) return null;
            element.scrollIntoView({{block: "center", inline: "center"}});
            const r = element.getBoundingClientRect();
            return {{x: r.left + r.width / 2, y: r.top + r.height / 2,
                     width: r.width, height: r.height}};
        }})()""")
        if box is None:
            raise BrowserError(f"click: no element matches {selector!r}")
        if box["width"] <= 0 or box["height"] <= 0:
            raise BrowserError(f"click: {selector!r} has no size on the page ({box})")
        self.click_at(box["x"], box["y"])
        return box["x"], box["y"]

    def click_at(self, x: float, y: float) -> None:
        """A real left click at (x, y), CSS px from the viewport's top left."""
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y,
                                                   "button": "left", "clickCount": 1})

    def screenshot(self, path: str | os.PathLike) -> Path:
        """The viewport as a PNG written to path."""
        result = self.send("Page.captureScreenshot", {"format": "png",
                                                      "captureBeyondViewport": False})
        path = Path(path)
        path.write_bytes(base64.b64decode(result["data"]))
        return path


def _scan(group: int, marker: str) -> tuple[list[int], list[int]]:
    """The browser's live processes (in its process group, or with marker, its temporary
    folder, in their command lines), and the zombies of its group that are this process's
    children. From /proc."""
    live, zombies = [], []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, parent, pgid = stat.read_text().rpartition(")")[2].split()[:3]
            if state == "Z":             # dead: its command line is empty
                if int(pgid) == group and int(parent) == os.getpid():
                    zombies.append(int(stat.parent.name))
            elif int(pgid) == group or marker.encode() in (stat.parent / "cmdline").read_bytes():
                live.append(int(stat.parent.name))
        except OSError:                  # exited while we looked
            continue
    return sorted(live), sorted(zombies)


def browser_processes(group: int, marker: str) -> list[int]:
    """The browser's live processes: in its process group, or with marker (its temporary
    folder) in their command lines."""
    return _scan(group, marker)[0]


def _reaped(pid: int) -> bool:
    """Reap pid if it is an exited child of this process; False while it is a child of
    this process that runs."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:            # not ours (its parent reaps it), or reaped already
        return True


def _stop(process: subprocess.Popen, marker: str) -> None:
    """SIGTERM to the browser's process group, SIGKILL after STOP_TIMEOUT_S, until none of
    its processes is left and those that became this process's children are reaped: the
    leader, and the helpers the browser started in sessions of their own (the crash
    handler), which end when it ends."""
    group = process.pid              # start_new_session: the group is the leader's pid
    seen = set(_scan(group, marker)[0])
    if process.poll() is None:
        _signal_group(group, signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _signal_group(group, signal.SIGKILL)
            process.wait()
    seen.discard(group)              # reaped by process.wait()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    killed = False
    while True:
        live, zombies = _scan(group, marker)
        seen = {pid for pid in seen | set(live) | set(zombies) if not _reaped(pid)}
        left = sorted(seen | set(live))
        if not left:
            return
        if time.monotonic() >= deadline:
            if killed:
                raise BrowserError(f"browser processes {left} survive SIGKILL")
            _signal_group(group, signal.SIGKILL)
            for pid in live:
                _signal(pid, signal.SIGKILL)
            killed, deadline = True, time.monotonic() + STOP_TIMEOUT_S
        time.sleep(0.05)


def _set_subreaper(on: bool) -> bool:
    """Make this process the child subreaper (prctl(2)) or not; returns the previous setting."""
    libc = ctypes.CDLL(None, use_errno=True)
    was = ctypes.c_int(0)
    if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(was), 0, 0, 0) != 0 or \
            libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno)}")
    return bool(was.value)


def _signal_group(group: int, sig: int) -> None:
    """Send sig to a process group (nothing when none of it is left)."""
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def _signal(pid: int, sig: int) -> None:
    """Send sig to a process (nothing when it is gone)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
