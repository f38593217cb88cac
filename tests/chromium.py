"""Headless Chromium for the tests that look at a page as a reader does: where it is, its flags,
and the two ways it is run (the DOM after the page's own scripts ran, and a screenshot)."""

import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
"""The browser, or None where none is installed (the tests that need it skip, saying why)."""

SKIP_REASON = "chromium is not installed (Debian: apt-get install chromium); the check needs a headless browser"

CHROME_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--virtual-time-budget=5000",
]


def chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    """Run the browser with ``CHROME_FLAGS``, a fresh profile directory and ``args``."""
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True, timeout=180
    )


def root_data(dom: str) -> dict[str, str]:
    """The ``data-*`` attributes of the dumped page's ``<html>`` element (written by its load handler)."""
    m = re.search(r"<html([^>]*)>", dom)
    assert m, dom[:500]
    return dict(re.findall(r'data-([a-z-]+)="([^"]*)"', m.group(1)))


def page_widths(url: str, tmp_path: Path, width: int = 1280) -> dict[str, str]:
    """Load ``url`` in a window ``width`` CSS pixels wide and return its ``<html>`` data attributes
    (``scroll-width`` and ``client-width`` among them: the page's width and the window's)."""
    dom = chromium([f"--window-size={width},1000", "--dump-dom", url], tmp_path / "profile-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    return root_data(dom.stdout)


def screenshot(url: str, shot: Path, tmp_path: Path, size: tuple[int, int] = (1280, 2400)) -> Path:
    """A screenshot of ``url`` at ``size`` CSS pixels, written to ``shot``."""
    proc = chromium([f"--window-size={size[0]},{size[1]}", f"--screenshot={shot}", url], tmp_path / "profile-shot")
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    return shot
