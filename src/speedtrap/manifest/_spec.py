"""The manifest's typed contents: target, patches, probe, verdict, search (read once by ``_parse``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError
from speedtrap.spec import RULES as RULES
from speedtrap.spec import Verdict
from speedtrap.stack import PatchSpec, TargetSpec

EXECUTORS = ("local", "ray")
PROBE_KINDS = ("divergence", "recall", "command")
PROBE_APIS = ("openai", "vllm", "sglang")  # the prompt-logprob dialect of probe.HttpBackend
DIRECTIONS = ("above", "below")  # the spec's polarities
REFERENCE_MODES = ("recorded", "live")
VerdictSpec = Verdict  # the verdict is the spec's; isolate's historical name for it


@dataclass(frozen=True)
class ProbeSpec:
    kind: str = "divergence"
    preset: str | None = "quick"
    settings: Mapping[str, Any] = field(default_factory=dict)
    argv: tuple[str, ...] = ()  # kind = "command"
    timeout: float = 600.0  # kind = "command": seconds
    api: str = "openai"  # server targets: the prompt-logprob dialect (openai | vllm | sglang)
    model: str | None = None  # server targets: the model name requests carry (None: target.served_model)
    # kind = "divergence": the baseline. "recorded": servers record the baseline configuration once, then
    # trials compare with the recording (one server at a time; in-process targets compare live); "live":
    # a reference server beside each trial; else the path of a recording (speedtrap record).
    reference: str = "recorded"

    @property
    def reference_file(self) -> Path | None:
        return None if self.reference in REFERENCE_MODES else Path(self.reference)

    def identity(self) -> dict[str, Any]:
        out = {"kind": self.kind, "preset": self.preset, "settings": dict(self.settings), "argv": list(self.argv)}
        if self.api != "openai" or self.model is not None:  # left out when default: earlier runs' keys hold
            out.update(api=self.api, model=self.model)
        return out

    def probe_settings(self, repeat: int) -> Any:
        """The probe package's settings object (``probe.settings_for`` on the typed probe): preset, then the
        manifest's fields; repeats shift the seed. A bad field is a ManifestError."""
        from speedtrap import probe
        from speedtrap._errors import ManifestError, UsageError
        from speedtrap.spec import DivergenceProbe, RecallProbe

        cls = DivergenceProbe if self.kind == "divergence" else RecallProbe
        kind = "divergence" if self.kind == "divergence" else "recall"
        typed = cls.model_construct(kind=kind, preset=self.preset, settings=dict(self.settings))  # checked on load
        try:
            return probe.settings_for(typed, repeat)
        except UsageError as exc:
            raise ManifestError(exc.problem, exc.fix) from None


@dataclass(frozen=True)
class Manifest:
    """A ``speedtrap.toml``, read once (:func:`speedtrap.manifest.load_manifest`) and handed to every stage.

    ``target_spec`` is None for a manifest triage reads alone (``[[patches]]`` and ``tree``), or whose
    ``[target]`` cannot launch yet: a stage that launches asks for :attr:`target`, which raises the
    problem. ``verdict_spec`` is None where ``[verdict]`` has no bound and nothing to derive one from (a gate
    that supplies its own rule still runs): :attr:`verdict` raises the problem found when it was read.
    """

    path: Path | None
    target_spec: TargetSpec | None
    patches: tuple[PatchSpec, ...]
    probe: ProbeSpec = ProbeSpec()
    verdict_spec: VerdictSpec | None = field(default_factory=VerdictSpec)
    prior: tuple[str, ...] = ()
    parallel: int = 1  # trials at once (servers on threads, or Ray workers; Ray's default: what fits)
    executor: str = "local"  # local | ray
    address: str | None = None  # executor = "ray": the cluster (None: a local one started for the run)
    resources: tuple[tuple[str, float], ...] = ()  # executor = "ray": what one trial reserves
    tree: Path | None = None  # triage: the source tree the diffs apply to (``tree = ...``)
    verdict_problem: tuple[str, str] | None = None  # (problem, fix) when verdict_spec is None
    target_problem: tuple[str, str] | None = None  # (problem, fix) of a [target] triage reads past
    repo: Path | None = None  # commit patches: [target] repo and base (a full sha once resolved)
    base: str | None = None

    @property
    def target(self) -> TargetSpec:
        if self.target_spec is None:
            problem, fix = self.target_problem or ("manifest has no [target] table", "add a [target] table")
            raise ManifestError(problem, fix)
        return self.target_spec

    @property
    def verdict(self) -> VerdictSpec:
        if self.verdict_spec is None:
            problem, fix = self.verdict_problem or ("verdict.bound is missing", "write verdict.bound")
            raise ManifestError(problem, fix)
        return self.verdict_spec

    def patch(self, name: str) -> PatchSpec:
        for p in self.patches:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path) if self.path else None,
            "target": self.target_spec.to_json() if self.target_spec is not None else None,
            "patches": [p.to_json() for p in self.patches],
            "probe": {**self.probe.identity(), "timeout": self.probe.timeout, "reference": self.probe.reference},
            "verdict": self.verdict_spec.to_json() if self.verdict_spec is not None else None,
            "prior": list(self.prior),
            "parallel": self.parallel,
            "executor": self.executor,
            "address": self.address,
            "resources": dict(self.resources),
            "tree": str(self.tree) if self.tree is not None else None,
        }
