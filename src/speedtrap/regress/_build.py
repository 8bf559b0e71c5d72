"""The gate's own build: ``check --against REC --manifest F`` without a URL launches it, checks it, stops it.

So the hunt that follows a regression never meets the checked build still running (on a deployment that
needs every GPU, two stacks at once means every trial's launch meets a full machine). A URL target with
``--bisect-on-fail`` is stopped by ``--stop-command`` (an argv, never a shell) before the hunt, and the hunt
starts only once the URL stops answering.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from speedtrap._errors import UsageError
from speedtrap.isolate import ServerOracle
from speedtrap.manifest import Manifest


def build_config(manifest: Manifest, named: str | None) -> tuple[str, ...]:
    """The configuration to check: the patches named (comma-separated), or every switchable patch on."""
    names = [p.name for p in manifest.patches if not p.ungated]
    if named is None:
        return tuple(names)
    chosen = tuple(n.strip() for n in named.split(",") if n.strip())
    for n in chosen:
        if n not in names:
            raise UsageError(f"--config names no patch of the manifest: {n!r}", f"choose from: {', '.join(names)}")
    return chosen


def launch_build(
    written: Manifest, named: str | None, log_dir: Path, api: str | None = None, model: str | None = None
) -> tuple[Any, Any, Manifest]:
    """Start the manifest's build (a stack of roles or one server) in the configuration to check; the server and
    the probe's client of it as a trial's (a stack's tokenizer and prompt-logprob roles, its request timeout)."""
    from speedtrap.regress._hunt import manifest_without_rule

    manifest = manifest_without_rule(written)  # the recording is the probe, the bounds the rule
    if manifest.target.in_process:
        raise UsageError(
            "check without --target launches the manifest's build, but its target is in-process",
            "pass --target smol-moe (or a URL), or a manifest with target.launch / target.roles",
        )
    config = build_config(manifest, named)
    oracle = ServerOracle(manifest.target, manifest.patches, manifest.probe)
    log_dir.mkdir(parents=True, exist_ok=True)
    server, _seconds = oracle.start(config, log_dir / "checked-build.log")
    try:
        return server, oracle.backend(server, api, model), manifest
    except BaseException:
        server.stop()
        raise


def stop_url(command: str, url: str, timeout: float = 120.0) -> None:
    """Run the stop command (an argv split like a shell would, run without one), then wait until ``url`` is down."""
    argv: Sequence[str] = shlex.split(command)
    if not argv:
        raise UsageError("--stop-command is empty", "pass the command that stops the checked build")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
    except FileNotFoundError:
        raise UsageError(f"--stop-command: {argv[0]!r} not found", "give the full path") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"--stop-command ran past {timeout:g} s", "make it return once the build is stopped") from None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-2:])
        raise UsageError(f"--stop-command exited with code {done.returncode}: {tail}", "run it by hand")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            httpx.get(url.rstrip("/") + "/v1/models", timeout=2.0)
        except httpx.HTTPError:
            return
        time.sleep(0.5)
    raise UsageError(
        f"the checked build at {url} still answers {timeout:g} s after --stop-command",
        "make the stop command stop it: the hunt launches a stack per trial and needs the machine",
    )
