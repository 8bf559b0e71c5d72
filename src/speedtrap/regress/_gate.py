"""``check --against``, whole: measure the build against the recording, judge it, and on a regression hunt.

The order is the one the deployment needs: the build the gate launches from the manifest is stopped before
the hunt starts (one stack alive at a time); a URL build is stopped by the user's ``--stop-command`` before
the hunt; the hunt runs against the same recording, with the first failed bound as its rule; ``--localize``
then localizes each culprit inside the stack. A hunt that fails does not hide the regression: its error is
kept beside the gate's result (exit 1 stands). The CLI parses, calls :func:`run_gate` and prints.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._errors import SpeedtrapError
from speedtrap.regress._build import launch_build, stop_url
from speedtrap.regress._check import GateResult, judge_divergence, judge_recall
from speedtrap.regress._hunt import bisect_manifest

if TYPE_CHECKING:
    from speedtrap.isolate import IsolateResult
    from speedtrap.localize import StackLocalization
    from speedtrap.manifest import Manifest
    from speedtrap.probe import Backend, Recording
    from speedtrap.progress import Progress
    from speedtrap.spec import Bound


@dataclass
class GateRun:
    """What one ``check`` did: the gate's result, and the hunt (and localize) after a regression."""

    result: GateResult
    hunt: IsolateResult | None = None
    hunt_error: str | None = None  # the hunt's own failure, said beside the regression
    localized: list[StackLocalization] | None = None


@dataclass(frozen=True)
class GateRequest:
    """How the build is reached and what follows a regression (the CLI's options, parsed)."""

    kinds: Sequence[str]
    bounds: Sequence[Bound]
    margin: float = 0.0
    target: str | None = None  # a URL or an in-process target; None: launch the manifest's build
    config: str | None = None  # the launched build's patches (default: every switchable one)
    api: str | None = None  # the launched build's prompt-logprob dialect (None: the manifest's)
    model: str | None = None
    bisect_on_fail: bool = False
    stop_command: str | None = None
    localize: bool = False
    run_dir: Path | None = None


def run_gate(
    recording: Recording,
    request: GateRequest,
    manifest: Manifest | None,
    make_candidate: Callable[[], Backend],
    progress: Progress | None = None,
    announce: Callable[[str], None] = lambda _line: None,
) -> GateRun:
    """Gate the build; ``make_candidate`` reaches a ``--target`` build (unused when the manifest's is launched)."""
    launched = None
    target = request.target
    if target is None:
        assert manifest is not None
        folder = request.run_dir if request.run_dir is not None else Path(tempfile.mkdtemp(prefix="speedtrap-check-"))
        launched, cand, _ = launch_build(manifest, request.config, folder / "build", request.api, request.model)
        target = f"http://127.0.0.1:{launched.port}"
    try:
        if launched is None:
            cand = make_candidate()
        result = measure(recording, cand, request.kinds, request.bounds, request.margin, target)
    finally:
        if launched is not None:
            launched.stop()  # before any hunt: one stack alive at a time
    run = GateRun(result)
    if result.passed or not request.bisect_on_fail:
        return run
    if request.stop_command is not None:
        stop_url(request.stop_command, target)
    assert manifest is not None
    try:
        announce("regression: searching the culprit patches (--bisect-on-fail)")
        model = getattr(cand, "model", None)  # the gate's loaded in-process model, reused by the hunt
        run.hunt = bisect_manifest(manifest, recording, result.failures(), request.run_dir, progress, model)
        if request.localize:
            from speedtrap.localize import localize_manifest

            culprits = [tuple(c) for c in run.hunt.culprit_names]
            if culprits:
                announce(f"localizing {len(culprits)} culprit set(s) inside the stack (one launch at a time)")
                where = (request.run_dir or Path(tempfile.mkdtemp(prefix="speedtrap-check-"))) / "localize"
                run.localized = localize_manifest(manifest, culprits, where)
            else:
                run.localized = []
    except SpeedtrapError as exc:  # the regression stands (exit 1); the hunt's error is said beside it
        run.hunt_error = exc.one_line()
    return run


def measure(
    recording: Recording, cand: Backend, kinds: Sequence[str], bounds: Sequence[Bound], margin: float, target: str
) -> GateResult:
    """The build measured against the recording and judged by the bounds (divergence) and the margin (recall)."""
    from speedtrap.probe import run_against

    started = time.perf_counter()
    measured = run_against(recording, cand, list(kinds), progress=True)
    checks: list[Any] = []
    if measured.divergence is not None:
        checks += judge_divergence(measured.divergence, list(bounds))
    if measured.recall is not None:
        checks += judge_recall(measured.recall, margin)
    reading = measured.divergence.reading() if measured.divergence is not None else None
    elapsed = time.perf_counter() - started
    return GateResult(recording.path, target, checks, measured.notes, measured.to_json(), elapsed, reading)
