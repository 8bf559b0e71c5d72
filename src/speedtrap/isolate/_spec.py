"""The manifest's typed contents: target, patches, probe, verdict (read by ``_manifest``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._redact import redact_argv, redact_env
from speedtrap.spec import RULES as RULES
from speedtrap.spec import Gate, GateKind, Platform, Verdict

if TYPE_CHECKING:
    from speedtrap.isolate._roles import StackSpec

EXECUTORS = ("local", "ray")
PROBE_KINDS = ("divergence", "recall", "command")
PROBE_APIS = ("openai", "vllm", "sglang")  # the prompt-logprob dialect of probe.HttpBackend
DIRECTIONS = ("above", "below")  # the spec's polarities
DEFAULT_HEALTH = "http://127.0.0.1:{port}/health"
REFERENCE_MODES = ("recorded", "live")
VerdictSpec = Verdict  # the verdict is the spec's; isolate's historical name for it


@dataclass(frozen=True)
class PatchSpec:
    """One patch: how to switch it on (env vars, launch args, config keys) and how it relates to others."""

    name: str
    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()
    config: tuple[tuple[str, str], ...] = ()
    ungated: bool = False
    diff: Path | None = None
    summary: str = ""
    requires: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    commit: str | None = None  # as written: a sha or A..B of target.repo
    commits: tuple[str, ...] = ()  # resolved: full shas, in history order
    commit_rank: tuple[int, ...] = field(default=(), compare=False)  # each commit's place in base..HEAD
    roles: tuple[str, ...] = ()  # a stack's roles it is switched on in (); () : every role that runs the model

    @property
    def gate(self) -> Gate:
        """How it is switched on (one of the patching module's gates)."""
        if self.ungated:
            kind = GateKind.UNGATED
        elif self.commit is not None and not (self.env or self.args or self.config):
            kind = GateKind.COMMIT
        else:
            kind = (
                GateKind.ENV
                if self.env
                else GateKind.FLAG
                if self.args
                else GateKind.CONFIG
                if self.config
                else GateKind.IN_PROCESS
            )
        return Gate(kind, self.env, self.args, self.config)

    def switch(self) -> dict[str, Any]:
        """What turns it on: part of a trial's identity (changing a switch changes the trial)."""
        out = {"env": dict(self.env), "args": list(self.args), "config": dict(self.config), "ungated": self.ungated}
        if self.commit is not None:
            out["commits"] = list(self.commits or (self.commit,))
        if self.roles:  # left out when empty: earlier runs' trial keys hold
            out["roles"] = list(self.roles)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "gate": self.gate.kind.value,
            **self.switch(),
            "diff": str(self.diff) if self.diff else None,
            "summary": self.summary,
            "requires": list(self.requires),
            "conflicts": list(self.conflicts),
            **({"commit": self.commit, "commits": list(self.commits)} if self.commit is not None else {}),
        }


@dataclass(frozen=True)
class TargetSpec:
    """An in-process target (``name``) or a server launched per configuration (``launch``)."""

    name: str | None = None
    overrides: tuple[tuple[str, str], ...] = ()
    launch: tuple[str, ...] = ()
    model: str | None = None
    health: str = DEFAULT_HEALTH
    served_model: str | None = None
    start_timeout: float = 120.0
    stop_timeout: float = 10.0
    env: tuple[tuple[str, str], ...] = ()
    config_args: tuple[str, ...] = ("--set", "{key}={value}")
    retries: int = 1
    cwd: Path | None = None
    repo: Path | None = None  # commit patches: the stack's git checkout (only read)
    base: str | None = None  # commit patches: the commit they apply to (resolved: a full sha)
    pythonpath: tuple[str, ...] = (".",)  # commit patches: worktree folders put first on PYTHONPATH
    stack: StackSpec | None = None  # target.roles: a multi-process stack (launch/health are its entry's)
    platform: Platform | None = None  # target.platform: the hardware served on (triage reads it; isolate checks it)

    @property
    def in_process(self) -> bool:
        return not self.launch

    def identity(self) -> dict[str, Any]:
        if self.in_process:
            return {"in_process": self.name, "overrides": dict(self.overrides)}
        return {  # secrets in the launch line or env are hidden: identities are stored in run directories
            "launch": redact_argv(self.launch),
            "model": _file_identity(self.model),
            "served_model": self.served_model,
            "env": redact_env(dict(self.env))[0],
            "config_args": list(self.config_args),
            **({"base": self.base, "pythonpath": list(self.pythonpath)} if self.repo is not None else {}),
            **({"stack": self.stack.to_json()} if self.stack is not None else {}),
        }

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name} if self.in_process else {}
        if self.in_process:
            out["overrides"] = dict(self.overrides)
            return out
        out.update(  # written into run directories and reports: secrets hidden
            launch=redact_argv(self.launch),
            model=self.model,
            health=self.health,
            served_model=self.served_model,
            start_timeout=self.start_timeout,
            stop_timeout=self.stop_timeout,
            env=redact_env(dict(self.env))[0],
            config_args=list(self.config_args),
            retries=self.retries,
            cwd=str(self.cwd) if self.cwd else None,
        )
        if self.repo is not None:
            out.update(repo=str(self.repo), base=self.base, pythonpath=list(self.pythonpath))
        if self.stack is not None:
            out["stack"] = self.stack.to_json()
        return out


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
class IsolateManifest:
    path: Path | None
    target: TargetSpec
    patches: tuple[PatchSpec, ...]
    probe: ProbeSpec = ProbeSpec()
    verdict: VerdictSpec = field(default_factory=VerdictSpec)
    prior: tuple[str, ...] = ()
    parallel: int = 1  # trials at once (servers on threads, or Ray workers; Ray's default: what fits)
    executor: str = "local"  # local | ray
    address: str | None = None  # executor = "ray": the cluster (None: a local one started for the run)
    resources: tuple[tuple[str, float], ...] = ()  # executor = "ray": what one trial reserves

    def patch(self, name: str) -> PatchSpec:
        for p in self.patches:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path) if self.path else None,
            "target": self.target.to_json(),
            "patches": [p.to_json() for p in self.patches],
            "probe": {**self.probe.identity(), "timeout": self.probe.timeout, "reference": self.probe.reference},
            "verdict": self.verdict.to_json(),
            "prior": list(self.prior),
            "parallel": self.parallel,
            "executor": self.executor,
            "address": self.address,
            "resources": dict(self.resources),
        }


def _file_identity(path: str | None) -> Any:
    """A model file's identity without hashing gigabytes: path, size and modification time."""
    if not path:
        return None
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return {"path": path}
    return {"path": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
