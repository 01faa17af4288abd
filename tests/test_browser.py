"""tests/browser.py itself: headless Chromium opens a page, reports its errors, clicks with
the real mouse, takes screenshots, and leaves no process behind."""

from __future__ import annotations

import time

import psutil
import pytest
from PIL import Image, ImageDraw

from tests import browser
from tests.browser import Browser, BrowserError, chromium_path, not_blank, skip_reason

needs_browser = pytest.mark.skipif(skip_reason() is not None, reason=skip_reason() or "")

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>harness</title>
<style>body {{ margin: 0; font: 16px sans-serif; }} #go {{ width: 120px; height: 40px; }}</style>
</head><body>
<svg id="fabric" width="400" height="200" viewBox="0 0 400 200">
  <rect x="10" y="10" width="120" height="60" fill="#1f77b4"/>
  <circle cx="250" cy="60" r="40" fill="#ff7f0e"/>
  <line x1="70" y1="70" x2="250" y2="100" stroke="#2ca02c" stroke-width="6"/>
  <text x="20" y="180" font-size="24" fill="#d62728">spine1 -> leaf2</text>
</svg>
<div><button id="go">go</button></div>
<div id="out">before</div>
<script>
document.getElementById("go").addEventListener("click", (event) => {{
  document.getElementById("out").textContent =
    event.isTrusted ? "clicked by the mouse" : "clicked by a script";
}});
{extra}
</script>
</body></html>
"""


def write_page(folder, name, extra=""):
    path = folder / name
    path.write_text(PAGE.format(extra=extra))
    return path


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of procs still running (the same process: pid and start time)."""
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def snapshot(b: Browser) -> list[psutil.Process]:
    procs = []
    for pid in b.pids():
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return procs


def error_seen(b: Browser, text: str, timeout_s: float = 10) -> bool:
    """Whether an error naming text arrives within timeout_s (events are read while
    commands wait: a round trip every 50 ms)."""
    deadline = time.monotonic() + timeout_s
    while not any(text in e for e in b.errors):
        if time.monotonic() >= deadline:
            return False
        b.evaluate("1")
        time.sleep(0.05)
    return True


@needs_browser
def test_a_clean_page_opens_clicks_and_draws(tmp_path):
    page = write_page(tmp_path, "clean.html")
    with Browser(width_px=800, height_px=600) as b:
        procs = snapshot(b)
        assert b.process.pid in [p.pid for p in procs] and len(procs) > 1
        b.open(page.as_uri())
        assert b.evaluate("document.title") == "harness"
        assert b.evaluate("document.querySelectorAll('#fabric > *').length") == 4
        assert b.evaluate("document.getElementById('out').textContent") == "before"
        x, y = b.click("#go")
        assert 0 < x < 800 and 0 < y < 600
        assert b.wait_for("document.getElementById('out').textContent !== 'before' && "
                          "document.getElementById('out').textContent") == "clicked by the mouse"
        shot = b.screenshot(tmp_path / "clean.png")
        assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert not_blank(shot)
        assert b.errors == []
        procs = snapshot(b)
    assert b.process.poll() is not None
    assert alive(procs) == [] and b.pids() == []


@needs_browser
def test_a_thrown_error_and_console_error_are_reported(tmp_path):
    page = write_page(tmp_path, "bad.html", extra=(
        'console.error("fabric data missing");\n'
        'throw new Error("drawing failed: no links");'))
    with Browser() as b:
        b.open(page.as_uri())
        b.evaluate("1")            # a round trip: the events before its reply are read
        assert any("drawing failed: no links" in e for e in b.errors), b.errors
        assert any("console.error: fabric data missing" in e for e in b.errors), b.errors
        assert len(b.errors) == 2, b.errors
        # a missing resource is in the browser's error log; a failed console.assert counts
        b.evaluate("(() => { const img = document.createElement('img'); "
                   "img.src = 'missing.png'; document.body.append(img); "
                   "console.assert(1 === 2, 'one is two'); })()")
        assert "console.assert: one is two" in b.errors, b.errors
        assert error_seen(b, "missing.png"), b.errors
        # an exception thrown by evaluate itself is raised, not counted as the page's
        with pytest.raises(BrowserError, match="nope"):
            b.evaluate("(() => { throw new Error('nope'); })()")
        assert not any("nope" in e for e in b.errors)
        # the page still works after its script threw
        b.click("#go")
        assert b.wait_for("document.getElementById('out').textContent === "
                          "'clicked by the mouse'")


@needs_browser
def test_a_blank_page_screenshot_is_blank(tmp_path):
    page = tmp_path / "blank.html"
    page.write_text("<!doctype html><html><body style='margin:0;background:#fff'></body></html>")
    with Browser(width_px=400, height_px=300) as b:
        b.open(page.as_uri())
        shot = b.screenshot(tmp_path / "blank.png")
        assert b.errors == []
    assert shot.is_file() and not not_blank(shot)


@needs_browser
def test_clicking_nothing_and_waiting_for_nothing_raise(tmp_path):
    page = write_page(tmp_path, "clean.html")
    with Browser(width_px=800, height_px=600) as b:
        b.open(page.as_uri())
        with pytest.raises(BrowserError, match="no element matches '#absent'"):
            b.click("#absent")
        with pytest.raises(BrowserError, match="after 0.3 s"):
            b.wait_for("document.getElementById('out').textContent === 'never'",
                       timeout_s=0.3)
        # a click at a point: beside everything (nothing happens), then on the button
        b.click_at(790, 590)
        assert b.evaluate("document.getElementById('out').textContent") == "before"
        box = b.evaluate("(() => { const r = document.getElementById('go')"
                         ".getBoundingClientRect(); return [r.left + 5, r.top + 5]; })()")
        b.click_at(*box)
        assert b.wait_for("document.getElementById('out').textContent === "
                          "'clicked by the mouse'")
        with pytest.raises(BrowserError, match="ERR_FILE_NOT_FOUND"):
            b.open((tmp_path / "missing.html").as_uri())
        # the next page opens, and open() waited for its own load, not the error page's
        b.open(write_page(tmp_path, "next.html", extra='document.title = "next";').as_uri())
        assert b.evaluate("document.title + ' ' + document.readyState") == "next complete"
        assert b.errors == []


@needs_browser
def test_no_process_outlives_the_with_even_on_an_exception():
    with pytest.raises(RuntimeError, match="the test failed here"):
        with Browser() as b:
            procs = snapshot(b)
            assert len(procs) > 1
            raise RuntimeError("the test failed here")
    assert b.process.poll() is not None
    assert alive(procs) == [] and b.pids() == []


def test_no_browser_on_path_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert chromium_path() is None
    reason = skip_reason()
    assert reason is not None and "scripts/setup.sh" in reason and "chromium" in reason
    with pytest.raises(BrowserError, match="scripts/setup.sh"):
        Browser().start()


def test_the_first_browser_on_path_is_used(tmp_path, monkeypatch):
    for name in ("google-chrome", "chromium-headless-shell"):
        exe = tmp_path / name
        exe.write_text("#!/bin/sh\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert chromium_path() == str(tmp_path / "chromium-headless-shell")
    assert skip_reason() is None


def test_a_browser_that_exits_at_once_is_reported_with_its_stderr(tmp_path, monkeypatch):
    exe = tmp_path / "chromium"
    exe.write_text("#!/bin/sh\necho 'cannot open display: this is the stderr' >&2\nexit 3\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    b = Browser()
    with pytest.raises(BrowserError, match="exited with code 3") as error:
        with b:
            pass
    assert "cannot open display: this is the stderr" in str(error.value)
    assert b.process.poll() == 3 and b._tmp is None      # the profile is removed


def test_not_blank_counts_colours(tmp_path):
    flat = tmp_path / "flat.png"
    Image.new("RGB", (600, 400), "#ffffff").save(flat)
    assert not not_blank(flat)
    drawn = tmp_path / "drawn.png"
    image = Image.new("RGB", (600, 400), "#ffffff")
    draw = ImageDraw.Draw(image)
    for i, colour in enumerate(("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd")):
        draw.ellipse((20 + 100 * i, 50, 100 + 100 * i, 130), fill=colour)
        draw.line((0, 200 + 30 * i, 600, 220 + 30 * i), fill=colour, width=3)
    image.save(drawn)
    assert not_blank(drawn)
    assert browser.not_blank(drawn, min_colours=10_000) is False
