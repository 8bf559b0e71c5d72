"""Headless Chromium for the report tests: installed from Debian's package when absent (once, under a lock)."""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

INSTALL_LOCK = Path("/tmp/speedtrap-chromium-install.lock")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--virtual-time-budget=5000",
)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass(frozen=True)
class Install:
    path: str | None
    seconds: float
    why_not: str = ""


def ensure_chromium() -> Install:
    """Chromium's path, installing Debian's ``chromium`` with apt-get if it is absent (idempotent)."""
    t0 = time.perf_counter()
    found = find_chromium()
    if found:
        return Install(found, 0.0)
    if not shutil.which("apt-get"):
        return Install(None, 0.0, "chromium is not installed and there is no apt-get to install it")
    if os.geteuid() != 0:
        return Install(None, 0.0, "chromium is not installed and installing it needs root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(INSTALL_LOCK, "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second test session waits for the first one's install
        if find_chromium() is None:
            for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium"]):
                done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
                if done.returncode != 0:
                    tail = " | ".join(done.stderr.strip().splitlines()[-3:])
                    return Install(None, time.perf_counter() - t0, f"{' '.join(argv)} failed: {tail}")
    return Install(find_chromium(), time.perf_counter() - t0)


def _run(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [chromium, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def screenshot(chromium: str, page: Path, out: Path, profile: Path, size: str = "1280,4000") -> Path:
    _run(chromium, profile, f"--screenshot={out}", f"--window-size={size}", page.resolve().as_uri())
    return out


@dataclass(frozen=True)
class PageCheck:
    """What the page's own check script wrote on ``<body>`` after the load event, and the console."""

    checked: bool
    images: int
    broken_images: int
    script_errors: int
    dom: str
    console_errors: list[str]


def check_page(chromium: str, page: Path, profile: Path) -> PageCheck:
    done = _run(chromium, profile, "--dump-dom", "--enable-logging=stderr", "--v=0", page.resolve().as_uri())
    body = re.search(r"<body([^>]*)>", done.stdout)
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1) if body else ""))
    console = [
        line for line in done.stderr.splitlines() if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)
    ]
    return PageCheck(
        checked=attrs.get("checked") == "yes",
        images=int(attrs.get("images", "-1")),
        broken_images=int(attrs.get("broken-images", "-1")),
        script_errors=int(attrs.get("script-errors", "-1")),
        dom=done.stdout,
        console_errors=console,
    )
