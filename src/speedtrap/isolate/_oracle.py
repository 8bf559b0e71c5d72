"""Oracles: measure one configuration and report figures (the rule in ``_rules`` turns them into a verdict).

- :class:`FunctionOracle`: a Python callable (simulations, library users with their own check).
- :class:`InProcessOracle`: the probes on an in-process model, patches switched by name.
- :class:`ServerOracle`: a server launched per trial (env vars and launch args per patch), probed
  over HTTP (divergence or recall with the probe package, or any command printing JSON figures),
  then stopped. Divergence compares against a recording of the baseline configuration, made once
  before the trials (``_reference``), or with ``reference = "live"`` against a reference server
  kept up for the whole run.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from speedtrap._errors import ManifestError, ProbeError, ServerError, SpeedtrapError
from speedtrap.isolate import _reference
from speedtrap.isolate._executor import Measurement, OracleRecipe, TrialRequest
from speedtrap.isolate._results import Config
from speedtrap.manifest import ProbeSpec
from speedtrap.stack import Launcher, LaunchSpec, PatchSpec, Server, Stack, StackGuard, TargetSpec, render

if TYPE_CHECKING:
    from speedtrap.targets import InProcessModel


def _version() -> str:
    try:
        return metadata.version("speedtrap")
    except metadata.PackageNotFoundError:
        return "0"


class FunctionOracle:
    """Figures from a function of (configuration, repeat): simulated stacks, or a caller's own check."""

    def __init__(self, fn: Callable[[Config, int], Mapping[str, float]], identity: Mapping[str, Any]) -> None:
        self.fn = fn
        self._identity = dict(identity)

    def identity(self) -> dict[str, object]:
        return {"function": self._identity}

    def measure(self, request: TrialRequest, attempt: int) -> Measurement:
        t0 = time.perf_counter()
        figures = {k: float(v) for k, v in self.fn(request.config, request.repeat).items()}
        return Measurement(figures, probe_s=time.perf_counter() - t0)

    def recipe(self) -> OracleRecipe:
        return functools.partial(FunctionOracle, self.fn, self._identity)

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------
# Figures from the probe package's reports.


def report_figures(kind: str, report: Any) -> dict[str, float]:
    """The figures a rule can read: recall's overall counts and interval, divergence's per-phase overall."""
    if kind == "recall":
        overall = report.overall
        correct = getattr(overall, "correct", None)
        n = float(overall.n)
        figures = {"accuracy": float(overall.accuracy), "low": float(overall.low), "high": float(overall.high), "n": n}
        figures["correct"] = float(correct) if correct is not None else round(float(overall.accuracy) * n)
        return figures
    from speedtrap.probe import divergence_figures

    return divergence_figures(report.phases)  # per phase, and the worse phase


def divergence_goal(verdict: Any) -> Any:
    """The goal a divergence probe may stop on from the manifest's ``[verdict]`` (a threshold rule with
    ``sequential``, the default), or None: the full grid (``speedtrap.probe.DivergenceGoal``).

    The goal's bound is the far edge of the verdict's "near" band (``bound x (1 + near)`` for a figure failing
    above it), so a trial stops only where its figure is a clear fail: the rule then calls it what it calls the
    full grid's figure (the worse phase's is at least the measured phase's), with no recheck the stop could add."""
    if verdict is None or not verdict.sequential or verdict.rule != "threshold":
        return None
    from speedtrap.probe import DivergenceGoal

    band = abs(verdict.bound) * verdict.near
    edge = verdict.bound + band if verdict.direction == "above" else verdict.bound - band
    return DivergenceGoal.of(verdict.metric, edge, verdict.direction)


def _write_report(request: TrialRequest, report: Mapping[str, Any]) -> str | None:
    if request.workdir is None:
        return None
    request.workdir.mkdir(parents=True, exist_ok=True)
    path = request.workdir / f"{request.label}.json"
    path.write_text(json.dumps(dict(report), indent=1, default=str))
    return str(path)


def load_target_model(target: TargetSpec, patches: Sequence[str] = ()) -> InProcessModel:
    """Load an in-process target by name, the user patches among ``patches`` in its catalogue."""
    from speedtrap.targets import load_target

    return load_target(str(target.name), dict(target.overrides) or None, patches)


def build_in_process_oracle(
    target: TargetSpec,
    probe: ProbeSpec,
    always_on: tuple[str, ...],
    patches: tuple[str, ...],
    recording: bytes = b"",
    goal: Any = None,
) -> InProcessOracle:
    """An in-process oracle built from scratch (the recipe another process runs)."""
    model = load_target_model(target, patches)
    oracle = InProcessOracle(model, target, probe, always_on, patches, goal)
    if recording:
        oracle._recording = _reference.from_bytes(recording, str(probe.reference))
    return oracle


class InProcessOracle:
    """The probes on an in-process model; ``always_on`` patches (ungated) are on in every trial."""

    def __init__(
        self,
        model: Any,
        target: TargetSpec,
        probe: ProbeSpec,
        always_on: Sequence[str] = (),
        patches: Sequence[str] = (),
        goal: Any = None,
    ) -> None:
        self.model = model
        self.goal = goal  # a DivergenceGoal: a live divergence probe stops once the verdict is decided
        self.target = target
        self.probe = probe
        self.always_on = tuple(always_on)
        self.patches = tuple(patches)  # the patches searched: the recipe loads the user's among them the same way
        self._baseline: Any = None  # one baseline backend: its logits are computed once per sequence
        self._recording: Any = None  # probe.reference = a file: the recorded baseline

    def prepare(self, run_dir: Path | None) -> None:
        """With a recording as the reference: load it and check it fits this model and these settings."""
        if self._recording is not None or self.probe.kind != "divergence" or self.probe.reference_file is None:
            return
        from speedtrap import probe

        recording = _reference.load_file(self.probe)
        baseline = probe.InProcessBackend(self.model, list(self.always_on))
        asyncio.run(probe.check_identity(recording, baseline))
        self._recording = recording

    def recipe(self) -> OracleRecipe:
        data = self._recording.data if self._recording is not None else b""
        return functools.partial(
            build_in_process_oracle, self.target, self.probe, self.always_on, self.patches, data, self.goal
        )

    def identity(self) -> dict[str, object]:
        out: dict[str, object] = {
            "target": self.target.identity(),
            "model_config": dict(self.model.config),
            "probe": self.probe.identity(),
            "always_on": list(self.always_on),
            "speedtrap": _version(),
        }
        if self._recording is not None:
            out["reference"] = {"recording": self._recording.digest}
        return out

    def measure(self, request: TrialRequest, attempt: int) -> Measurement:
        from speedtrap import probe

        settings = self.probe.probe_settings(request.repeat)
        patches = [*self.always_on, *request.config]
        t0 = time.perf_counter()
        candidate = probe.InProcessBackend(self.model, patches)
        report: Any
        if self.probe.kind == "recall":
            report = probe.run_recall(candidate, settings, progress=False)
        elif self._recording is not None:
            report = asyncio.run(probe.adivergence_against(self._recording, candidate, progress=False, goal=self.goal))
        else:
            if self._baseline is None:
                self._baseline = probe.InProcessBackend(self.model, list(self.always_on))
            report = probe.run_divergence(self._baseline, candidate, settings, progress=False, goal=self.goal)
        figures = report_figures(self.probe.kind, report)
        doc = report.to_json()
        return Measurement(figures, None, _write_report(request, doc), 0.0, time.perf_counter() - t0, doc)

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------------------------
# Servers.


class ServerOracle:
    """One server per trial, switched by the patches' env vars and launch arguments."""

    def __init__(
        self,
        target: TargetSpec,
        patches: Sequence[PatchSpec],
        probe: ProbeSpec,
        recording: bytes = b"",
        goal: Any = None,
        recall_reference: Any = None,
    ) -> None:
        self.goal = goal  # a DivergenceGoal: a live divergence probe stops once the verdict is decided
        # a probe.RecallReference (the baseline's answers): a recall probe with ``sequential`` settings asks in
        # rounds against it and stops each length once decided; None: the whole grid
        self.recall_reference = recall_reference
        self.target = target
        self.patches = {p.name: p for p in patches}
        self.order = [p.name for p in patches]
        self.probe = probe
        self.always_on = [p.name for p in patches if p.ungated]
        self._reference: Server | None = None
        self.reference_launches = 0  # live mode: reference servers started beside the trials
        self.recording_launches = 0  # recorded mode: baseline servers started to record (then stopped)
        self._recording: Any = _reference.from_bytes(recording, str(probe.reference)) if recording else None
        self.launcher = Launcher(target, patches, probe.model, slots=1 + self._live_reference())

    def _live_reference(self) -> int:
        return int(self.probe.kind == "divergence" and self.probe.reference == "live")

    def allow(self, trials: int) -> None:
        """Let ``trials`` trials run at once from threads of this process (plus a live reference server): the
        launch guard's slots (``speedtrap.stack.StackGuard``)."""
        self.launcher.guard = StackGuard(max(1, trials) + self._live_reference())

    def prepare(self, run_dir: Path | None, reuse: Path | None = None) -> None:
        """Recorded mode: record the baseline configuration now (one server, stopped before any trial).

        ``reuse``: a recording made earlier for the same probe (isolate's, for the run's evidence stage), taken
        as it is when it is complete and holds these settings; else the baseline is recorded into ``run_dir``."""
        if self._recording is not None or not _reference.uses_recording(self.probe):
            return
        if self.probe.reference_file is not None:
            self._recording = _reference.load_file(self.probe)
            return
        found = _reference.load_matching(self.probe, reuse) if reuse is not None else None
        self._recording = found if found is not None else _reference.record_server(self, run_dir)

    def identity(self) -> dict[str, object]:
        out: dict[str, object] = {
            "target": self.target.identity(),
            "probe": self.probe.identity(),
            "switches": {name: p.switch() for name, p in self.patches.items()},
        }
        if _reference.uses_recording(self.probe):
            out["reference"] = {"recording": self._recording.digest if self._recording is not None else None}
        return out

    def recipe(self) -> OracleRecipe:
        data = self._recording.data if self._recording is not None else b""  # no reference server on workers
        return functools.partial(
            ServerOracle, self.target, tuple(self.patches[n] for n in self.order), self.probe, data, self.goal
        )

    def launch_spec(self, config: Config, port: int) -> LaunchSpec:
        """argv and env for one configuration: the base environment without any patch's variables."""
        return self.launcher.launch_spec(config, port)

    def start_stack(self, config: Config, log: Path) -> tuple[Stack, float]:
        """Every role of ``config``'s stack, healthy and answering one real request through the entry."""
        return self.launcher.start_stack(config, log)

    def worktree(self, config: Config) -> Path | None:
        """The worktree of ``config``'s commits (base + them, cherry-picked), for targets with a repo."""
        return self.launcher.worktree(config)

    def _log(self, request: TrialRequest, attempt: int, suffix: str = "") -> Path:
        if request.workdir is None:
            raise ProbeError("a server trial needs a run directory for its log", "pass --run-dir")
        name = request.label + (f".a{attempt}" if attempt > 1 else "") + suffix + ".log"
        return request.workdir / name

    def start(self, config: Config, log: Path) -> tuple[Server, float]:
        """``config``'s server (or stack of roles), healthy; the caller stops it."""
        return self._start(config, log)

    def _start(self, config: Config, log: Path) -> tuple[Server, float]:
        return self.launcher.start(config, log)

    def backend(self, server: Server, api: Any = None, model: str | None = None) -> Any:
        """The probe's client of ``server``. On a stack: ``/tokenize`` asked of a model role where the entry
        has none (SGLang's router), and a request that outlives ``target.request_timeout`` not retried."""
        from speedtrap import probe

        model = model or self.probe.model or self.target.served_model or ""
        kw: dict[str, Any] = {"api": api or self.probe.api, "watch": server.died}
        stack = self.target.stack
        if stack is not None and isinstance(server, Stack):
            role = stack.model_roles[0] if stack.model_roles else stack.entry.name
            kw["tokenize_url"] = server.url(role)
            prompt = [r.name for r in stack.roles if r.prompt_logprobs]
            if prompt and kw["api"] == "sglang":
                kw["prompt_url"] = server.url(prompt[0])
            if self.target.request_timeout is not None:
                kw.update(timeout=self.target.request_timeout, retry_timeouts=False)
            return probe.HttpBackend(server.url(), model, **kw)
        return probe.HttpBackend(f"http://127.0.0.1:{server.port}", model, **kw)

    def reference(self, request: TrialRequest) -> Server:
        if self._reference is None or not self._reference.alive():
            self._reference, _ = self._start((), self._log(request, 1, ".reference"))
            self.reference_launches += 1
        return self._reference

    def measure(self, request: TrialRequest, attempt: int) -> Measurement:
        log = self._log(request, attempt)
        if self._recording is None and _reference.uses_recording(self.probe):  # before the trial's stack: one alive
            self.prepare(request.workdir.parent if request.workdir is not None else None)
        t0 = time.perf_counter()
        try:
            server, launch_s = self._start(request.config, log)
        except ServerError as exc:
            stack_log = exc.log if self.target.stack is not None and exc.log is not None else None
            raise _with_log(exc, stack_log or log) from None  # a stack's error names its role's log
        if self.target.stack is not None:
            log = server.log_path  # the entry role's log (each role has its own: trial-N.ROLE.log)
        with server:
            t1 = time.perf_counter()
            since = server.log_sizes() if isinstance(server, Stack) else None
            try:
                figures, doc = self._probe(server, request)
                probe_s = time.perf_counter() - t1  # the probe alone: the stack's stop below is not the probe's
            except Exception as exc:
                if isinstance(server, Stack) and isinstance(exc, (SpeedtrapError, httpx.HTTPError, OSError)):
                    # a router's HTTP 500 or a hang names no role: the role that exited or stalled, with its log
                    what = f"the probe failed: {_first_line(exc)}"
                    found = server.broken(since)
                    if found is not None:
                        raise _with_log(ServerError(f"{found.problem} ({what})", found.fix), found.log or log) from None
                    if "got no answer within" in what:
                        raise _with_log(server.diagnose(what, since), log) from None
                died = _died_soon(server)
                if died is not None:
                    raise _with_log(died, died.log or log) from None
                if isinstance(exc, (ProbeError, ServerError)):
                    raise _with_log(exc, log) from None
                if isinstance(exc, (httpx.HTTPError, OSError)):
                    error = ProbeError(f"the probe failed: {type(exc).__name__}: {exc}; server log: {log}")
                    raise _with_log(error, log) from None
                raise
        report_path = _write_report(request, doc) if doc is not None else None
        return Measurement(figures, str(log), report_path, launch_s or (t1 - t0), probe_s, doc)

    def _probe(self, server: Server, request: TrialRequest) -> tuple[dict[str, float], dict[str, Any] | None]:
        """The trial's figures and its probe report's JSON (None for a command probe)."""
        base_url = server.url() if isinstance(server, Stack) else f"http://127.0.0.1:{server.port}"
        if self.probe.kind == "command":
            return run_command_probe(self.probe, base_url, request), None
        from speedtrap import probe

        settings = self.probe.probe_settings(request.repeat)
        api: Any = self.probe.api
        if _reference.uses_recording(self.probe):
            return self._against_recording(server, request)
        ref = self.reference(request) if self.probe.kind == "divergence" and request.config else server

        async def measure() -> Any:
            candidate = self.backend(server, api)
            reference = candidate
            if ref is not server:
                reference = self.backend(ref, api)
            try:
                if self.probe.kind == "recall":
                    return await probe.arun_recall(candidate, settings, progress=False, reference=self.recall_reference)
                return await probe.arun_divergence(reference, candidate, settings, progress=False, goal=self.goal)
            finally:
                await candidate.aclose()
                if reference is not candidate:
                    await reference.aclose()

        report = asyncio.run(measure())
        return report_figures(self.probe.kind, report), report.to_json()

    def _against_recording(
        self, server: Server, request: TrialRequest
    ) -> tuple[dict[str, float], dict[str, Any] | None]:
        """Divergence of this trial's server from the recorded baseline (its identity checked first)."""
        from speedtrap import probe

        if self._recording is None:  # measure() records it before the trial's stack starts
            raise ProbeError("no recorded baseline to compare the trial with", "call prepare() before the trial")

        async def measure() -> Any:
            candidate = self.backend(server)
            try:
                await probe.check_identity(self._recording, candidate)
                return await probe.adivergence_against(self._recording, candidate, progress=False, goal=self.goal)
            finally:
                await candidate.aclose()

        report = asyncio.run(measure())
        return report_figures(self.probe.kind, report), report.to_json()

    def close(self) -> None:
        if self._reference is not None:
            self._reference.stop()
            self._reference = None
        self.launcher.close()


def _died_soon(server: Server, wait: float = 1.0) -> SpeedtrapError | None:
    """The server's exit error when it exits within ``wait`` seconds of a failed probe (a crash on a request
    shows to the client before the kernel reaps the process), else None."""
    deadline = time.monotonic() + wait
    while True:
        died = server.died()
        if died is not None or time.monotonic() >= deadline:
            return died
        time.sleep(0.05)


def _first_line(exc: BaseException) -> str:
    text = exc.one_line() if isinstance(exc, SpeedtrapError) else f"{type(exc).__name__}: {exc}"
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _with_log(exc: SpeedtrapError, log: Path) -> SpeedtrapError:
    """The error naming the trial's log (the trial record keeps it)."""
    return exc.with_log(log)


def run_command_probe(spec: ProbeSpec, base_url: str, request: TrialRequest) -> dict[str, float]:
    """Run the manifest's probe command; its last stdout line is one JSON object of figures."""
    values = {
        "base_url": base_url,
        "port": base_url.rsplit(":", 1)[-1],
        "repeat": str(request.repeat),
        "config": ",".join(request.config),
        "workdir": str(request.workdir or "."),
    }
    argv = render(spec.argv, values)
    env = dict(
        os.environ,
        SPEEDTRAP_BASE_URL=base_url,
        SPEEDTRAP_REPEAT=str(request.repeat),
        SPEEDTRAP_CONFIG=",".join(request.config),
    )
    try:
        done = subprocess.run(  # noqa: S603  (argv from the manifest, never a shell)
            argv, env=env, capture_output=True, text=True, timeout=spec.timeout, check=False
        )
    except FileNotFoundError:
        raise ManifestError(f"probe.argv[0]: command {argv[0]!r} not found", "give the full path") from None
    except subprocess.TimeoutExpired:
        raise ProbeError(f"the probe command ran past probe.timeout = {spec.timeout:g} s", "raise it") from None
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise ProbeError(f"the probe command exited with code {done.returncode}: {tail}", "run it by hand")
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    try:
        data = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        raise ProbeError("the probe command's last output line is not a JSON object", 'print e.g. {"metric": 0.1}')
    from speedtrap.probe import flatten_figures

    return flatten_figures(data)
