"""The pipeline's stages. Each stores its output in the run directory as soon as it has it, and an
earlier run's output with the same key is reused instead of measured again."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from speedtrap._errors import SpeedtrapError
from speedtrap.pipeline._context import Context
from speedtrap.pipeline._settings import stable_key
from speedtrap.report import commands
from speedtrap.rundir import (
    ISOLATE_DIR,
    LOCALIZE_DIR,
    PROBES_DIR,
    TRIAGE_FILE,
    Part,
    divergence_path,
    layers_path,
    patches_slug,
    recall_path,
    scale_path,
)

if TYPE_CHECKING:
    from speedtrap.isolate import IsolateResult
    from speedtrap.manifest import Manifest
    from speedtrap.spec import DivergenceProbe, RecallProbe

ISOLATE_KEY_FILE = "pipeline-key.json"
Kind = Literal["divergence", "recall"]

# -- triage -------------------------------------------------------------------------------------


def triage_stage(ctx: Context) -> dict[str, Any]:
    """Rank the patches from their diffs; returns triage's JSON (tiers, patches, trace)."""
    from speedtrap.triage import from_manifest, from_target, render_plan, triage

    def make(key: str) -> Part:
        if ctx.source.in_process:
            patch_set = from_target(str(ctx.source.target), None, ctx.settings.patches or ())
        else:
            patch_set = from_manifest(ctx.server_manifest(), None)
        try:
            symbol = ctx.source.symbol if patch_set.tree is not None else None
            report = triage(patch_set, symbol)
            plan = render_plan(report, patch_set.cli_args)
        finally:
            patch_set.close()
        return Part("triage", report.to_json(), command=commands.triage(ctx.source), extra={"plan_markdown": plan})

    ctx.progress.start("triage", 1)
    part = ctx.part(ctx.run_dir / TRIAGE_FILE, ("triage", ctx.source.symbol), make)
    ctx.progress.advance("triage", 1)
    return part.result


def tier_one(triage_json: dict[str, Any]) -> list[str]:
    return [str(n) for n in (triage_json.get("tiers") or {}).get("1", [])]


# -- probes -------------------------------------------------------------------------------------


def why_no_chat(ctx: Context) -> str | None:
    """Why planted-fact recall cannot run on this source (None when it can): it needs chats, so a
    tokenizer and a chat template; a tiny random-weight model has neither."""
    if not ctx.source.in_process:
        return None
    from speedtrap.targets import resolve_target

    target = resolve_target(str(ctx.source.target))
    if not target.chats:
        return (
            f"recall needs a tokenizer and a chat template; {target.name} has none (divergence runs on synthetic ids)"
        )
    return None


def identity(probe: DivergenceProbe | RecallProbe) -> dict[str, Any]:
    """What a stored probe part depends on (the shape of isolate's probe identity, so a divergence part
    and isolation's own trial of the same probe are known to be one measurement)."""
    return {"kind": probe.kind, "preset": probe.preset, "settings": dict(probe.settings), "argv": []}


def _measure(ctx: Context, kind: Kind, config: tuple[str, ...]) -> dict[str, Any]:
    """One probe run of one configuration: in-process, the probe package on the loaded model; a
    manifest's server, isolate's server oracle (it launches and stops the server). The probe's report
    comes back in memory, typed as its JSON."""
    from speedtrap import probe as probes

    typed = ctx.settings.probe(kind)
    config = tuple(sorted(config))
    if ctx.source.in_process:
        model = ctx.in_process_model()
        settings = probes.settings_for(typed)
        candidate = probes.InProcessBackend(model, list(config))
        if isinstance(settings, probes.RecallSettings):
            if settings.sequential:
                return _sequential_recall(ctx, settings, candidate, config)
            return probes.run_recall(candidate, settings, progress=False).to_json()
        assert isinstance(settings, probes.DivergenceSettings)
        baseline = probes.InProcessBackend(model, [])
        return probes.run_divergence(baseline, candidate, settings, progress=False).to_json()
    from speedtrap.isolate import RECORDING_NAME, ServerOracle, TrialRequest

    manifest = ctx.server_manifest()
    spec = server_probe(ctx, kind)
    reference = _server_recall_reference(ctx, config) if kind == "recall" else None
    if reference is not None:
        verdict = manifest.verdict
        rates = {"alpha": verdict.alpha, "beta": verdict.beta}  # the run's own settings win
        spec = dataclasses.replace(spec, settings={**rates, **spec.settings, "sequential": True})
    oracle = ServerOracle(manifest.target, manifest.patches, spec, recall_reference=reference)
    label = f"{kind}-{patches_slug(config)}"
    try:
        # the baseline recorded before the trial's stack starts (isolate's recording when it holds these
        # settings): a recording made while the trial's stack ran was a second stack alive on the node
        oracle.prepare(ctx.run_dir / PROBES_DIR, reuse=ctx.run_dir / ISOLATE_DIR / RECORDING_NAME)
        measurement = oracle.measure(TrialRequest(config, 0, ctx.run_dir / PROBES_DIR / ".logs", label), 1)
    finally:
        oracle.close()
    if measurement.report is None:
        raise SpeedtrapError(f"the {kind} probe returned no report", "use a divergence or recall probe")
    return measurement.report


def _server_recall_reference(ctx: Context, config: tuple[str, ...]) -> Any:
    """The baseline's answers a server's recall of ``config`` is asked against in rounds (None: the whole grid).

    Sequential unless the run's recall settings or the manifest's ``[verdict] sequential`` say otherwise. The
    baseline is measured first with its whole grid (its own part: launched, asked, stopped), so no server of
    it is alive beside the candidate's; the candidate then asks only until each length is decided."""
    from speedtrap import probe as probes

    if not config:
        return None
    chosen = ctx.settings.recall.get("sequential")
    if not (bool(chosen) if chosen is not None else ctx.server_manifest().verdict.sequential):
        return None
    return probes.RecallReference(None, _samples(probe(ctx, "recall", "baseline", "baseline", ()).result))


def _samples(result: Any) -> list[Any]:
    """The recall samples of a stored recall part's result (``probe.RecallSample``)."""
    from speedtrap import probe as probes

    rows = result.get("samples", []) if isinstance(result, dict) else []
    return [probes.RecallSample.from_json(s) for s in rows]


def sequential_recall(ctx: Context) -> bool:
    """Whether this run's in-process recall is sequential: the baseline asked lazily, in rounds beside each
    patched run (a server's recall is sequential too, against the baseline's whole grid measured first:
    :func:`_server_recall_reference`)."""
    from speedtrap import probe as probes

    settings = probes.settings_for(ctx.settings.probe("recall"))
    return ctx.source.in_process and isinstance(settings, probes.RecallSettings) and settings.sequential


def _baseline_key(ctx: Context) -> str:
    """The stored baseline recall part's key (what :meth:`Context.part` gives it)."""
    return stable_key(ctx.base_key(), "recall", identity(ctx.settings.probe("recall")), [])


def _sequential_recall(ctx: Context, settings: Any, candidate: Any, config: tuple[str, ...]) -> dict[str, Any]:
    """A sequential recall of ``config`` against the run's baseline, which is asked only the questions
    it has not answered yet (kept in the baseline's part, saved after each candidate). The baseline's
    own part is what it was asked."""
    from speedtrap import probe as probes
    from speedtrap.report import load_part, save_part

    if ctx.recall_reference is None:
        known: list[Any] = []
        try:
            stored = load_part(recall_path(ctx.run_dir, ()))
            if stored.key == _baseline_key(ctx):
                known = _samples(stored.result)
        except (OSError, ValueError, KeyError, TypeError):
            known = []
        ctx.recall_reference = probes.RecallReference(probes.InProcessBackend(ctx.in_process_model(), []), known)
    reference = ctx.recall_reference
    if not config:
        return dict(reference.report(settings).to_json())
    report = probes.run_recall(candidate, settings, progress=False, reference=reference)
    typed = ctx.settings.probe("recall")
    base = Part(
        "recall", reference.report(settings).to_json(), "baseline", "baseline", (),
        commands.recall(ctx.source, (), typed.settings), None, {}, _baseline_key(ctx),
    )  # fmt: skip
    save_part(recall_path(ctx.run_dir, ()), base)
    return dict(report.to_json())


def server_probe(ctx: Context, kind: Kind) -> Any:
    """The ProbeSpec a manifest's server is measured with: this run's probe, asked the way the manifest's
    ``[probe]`` says (``api``, ``model``): SGLang's ``/generate`` keyed by token id, vLLM's prompt_logprobs.
    Dropping them measured the evidence through the OpenAI endpoints against a recording keyed by id."""
    from speedtrap.manifest import ProbeSpec

    typed = ctx.settings.probe(kind)
    asked = ctx.server_manifest().probe
    return ProbeSpec(
        kind=typed.kind,
        preset=typed.preset,
        settings=dict(typed.settings),
        api=asked.api,
        model=asked.model,
        reference=asked.reference,  # the manifest's recording (a file) or mode, as isolate's trials have it
    )


def probe(ctx: Context, kind: Kind, label: str, role: str, config: Sequence[str]) -> Part:
    """Recall or divergence of one configuration (stored as ``probes/<kind>-<slug>.json``)."""
    patches = tuple(config)
    typed = ctx.settings.probe(kind)
    path = recall_path(ctx.run_dir, patches) if kind == "recall" else divergence_path(ctx.run_dir, patches)
    command = (commands.recall if kind == "recall" else commands.divergence)(ctx.source, patches, typed.settings)

    def make(key: str) -> Part:
        return Part(kind, _measure(ctx, kind, patches), label, role, patches, command)

    part = ctx.part(path, (kind, identity(typed), sorted(patches)), make)
    if part.label != label or part.role != role:  # the same measurement, seen in another role this time
        part = dataclasses.replace(part, label=label, role=role)
        from speedtrap.report import save_part

        save_part(path, part)
    return part


def summary(part: Part) -> str:
    """A probe part's headline figure for a progress line (" (18/20 right)"), or "" when it has none."""
    doc = part.result if isinstance(part.result, dict) else {}
    try:
        if doc.get("probe") == "recall":
            overall = doc["overall"]
            return f" ({int(overall['correct'])}/{int(overall['n'])} right)"
        if doc.get("probe") == "divergence":
            worst = max(float(p["overall"]["kl_p99"]) for p in doc["phases"].values())
            return f" (KL p99 {worst:.3g} nats)"
    except (KeyError, TypeError, ValueError):
        return ""
    return ""


def from_trial_report(
    ctx: Context, spec: Manifest, result: IsolateResult, config: Sequence[str], label: str, role: str
) -> Part | None:
    """A divergence part taken from isolation's own trial of ``config`` when isolation ran the same probe
    (same settings, same seed) and measured its whole grid: no second measurement."""
    mine = ctx.settings.probe("divergence")
    same = server_probe(ctx, "divergence").identity() if not ctx.source.in_process else identity(mine)
    if spec.probe.identity() != same:
        return None
    wanted = tuple(sorted(config))
    for trial in result.trials:
        if tuple(sorted(trial.config)) != wanted or trial.repeat != 0 or trial.status != "ok" or not trial.report_path:
            continue
        try:
            doc = json.loads(Path(trial.report_path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if doc.get("stopped"):  # stopped once its verdict was decided: the evidence measures the whole grid
            continue
        patches = tuple(config)
        part = Part(
            "divergence", doc, label, role, patches, commands.divergence(ctx.source, patches, mine.settings),
            extra={"from_trial": trial.index},
        )  # fmt: skip
        path = divergence_path(ctx.run_dir, patches)
        return ctx.part(path, ("divergence", identity(mine), sorted(patches)), partial(_same, part))
    return None


def _same(part: Part, key: str) -> Part:
    return part


# -- isolation ----------------------------------------------------------------------------------


def isolation_spec(ctx: Context, prior: Sequence[str]) -> Manifest:
    from speedtrap.isolate import DEFAULT_PROBE, DEFAULT_VERDICT, manifest_for_target

    if ctx.source.in_process:
        typed = ctx.settings.probe("divergence")
        probe = dataclasses.replace(DEFAULT_PROBE, preset=typed.preset, settings=dict(typed.settings))
        searched = ctx.settings.patches
        names = set(searched) if searched is not None else None
        prior = [p for p in prior if names is None or p in names]
        return manifest_for_target(
            str(ctx.source.target), searched, dict(ctx.settings.overrides), probe, DEFAULT_VERDICT, prior
        )
    manifest = ctx.server_manifest()
    if manifest.prior or not prior:
        return manifest
    names = {p.name for p in manifest.patches}
    return dataclasses.replace(manifest, prior=tuple(p for p in prior if p in names))


def isolate_stage(ctx: Context, prior: Sequence[str]) -> IsolateResult:
    """The culprit search (trials kept in ``isolate/trials.sqlite``; a rerun reuses every stored trial)."""
    from speedtrap.isolate import IsolateResult, isolate

    spec = isolation_spec(ctx, prior)
    folder = ctx.run_dir / ISOLATE_DIR
    key_doc = {"spec": {k: v for k, v in spec.to_json().items() if k != "path"}, "base": ctx.base_key()}
    key = json.dumps(key_doc, sort_keys=True, default=str)
    result_file, key_file = folder / "result.json", folder / ISOLATE_KEY_FILE
    try:
        if key_file.read_text(encoding="utf-8") == key:
            result = IsolateResult.from_json(json.loads(result_file.read_text(encoding="utf-8")))
            ctx.reused.append(f"{ISOLATE_DIR}/result.json")
            ctx.progress.start("isolate", len(result.trials), "reused")
            ctx.progress.advance("isolate", len(result.trials))
            return result
    except (OSError, ValueError, KeyError, TypeError):
        pass
    ctx.progress.start("isolate", None)
    model = ctx.in_process_model() if ctx.source.in_process else None
    result = isolate(spec, folder, resume=True, model=model, progress=ctx.progress)
    from speedtrap.rundir import write_atomic

    write_atomic(key_file, key)
    ctx.computed.append(f"{ISOLATE_DIR}/result.json")
    return result


# -- localization -------------------------------------------------------------------------------


def factors_read(triage_json: dict[str, Any] | None, patches: Sequence[str]) -> list[str]:
    """The factors triage read in the diffs of ``patches``: a double application's, then a scale change's."""
    found: list[str] = []
    for report in (triage_json or {}).get("patches") or []:
        if report.get("name") not in patches:
            continue
        names = [str(d.get("symbol") or "") for d in report.get("double_applications") or []]
        names += [str((s.get("data") or {}).get("factor") or "") for s in report.get("signals") or []
                  if s.get("kind") == "scale"]  # fmt: skip
        for name in names:
            if name.isidentifier() and name not in found:
                found.append(name)
    return found


def scale_factor(ctx: Context, triage_json: dict[str, Any] | None, patches: Sequence[str]) -> str | None:
    """The factor the scale check measures for ``patches``: ``--symbol`` when given, else the one triage read in
    their diffs, else the default (``routed_scaling_factor``)."""
    if ctx.source.symbol_given:
        return ctx.source.symbol
    read = factors_read(triage_json, patches)
    return read[0] if read else ctx.source.symbol


def localize_stage(
    ctx: Context, culprits: Sequence[tuple[str, ...]], triage_json: dict[str, Any] | None = None
) -> None:
    """Layer diff and scale check of each culprit set (in-process targets only)."""
    from speedtrap.localize import check_scale, default_ids, layer_diff

    tokens = ctx.settings.tokens
    factors = {patches: scale_factor(ctx, triage_json, patches) for patches in culprits}
    ctx.progress.start("localize", sum(2 if factors[p] else 1 for p in culprits))
    for patches in culprits:

        def make_layers(key: str, patches: tuple[str, ...] = patches) -> Part:
            model = ctx.in_process_model()
            result = layer_diff(model, list(patches), default_ids(model, tokens))
            command = commands.layers(ctx.source, patches, tokens)
            return Part("layers", result.to_json(), patches=patches, command=command)

        ctx.part(layers_path(ctx.run_dir, patches), ("layers", sorted(patches), tokens), make_layers)
        ctx.progress.advance("localize", 1, f"layer diff {' + '.join(patches)}")
        symbol = factors[patches]
        if not symbol:
            continue

        def make_scale(key: str, patches: tuple[str, ...] = patches, symbol: str = symbol) -> Part:
            model = ctx.in_process_model()
            values = ctx.settings.scale_values
            result = check_scale(model, default_ids(model, tokens), symbol, patches=list(patches), values=values)
            command = commands.scale(ctx.source, patches, tokens, values, symbol)
            return Part("scale", result.to_json(), patches=patches, command=command)

        values = None if ctx.settings.scale_values is None else list(ctx.settings.scale_values)
        ctx.part(scale_path(ctx.run_dir, patches), ("scale", sorted(patches), tokens, symbol, values), make_scale)
        ctx.progress.advance("localize", 1, f"scale check of {symbol} {' + '.join(patches)}")


def why_no_live_localize(ctx: Context) -> str | None:
    """Why a manifest's stack cannot be localized live (None when it can): the prompt comes from the tokenizer
    or config of the served model's folder, so a target without one (a GGUF file served by llama.cpp, a
    server speedtrap cannot reach inside) is skipped with that said, not failed."""
    model = ctx.server_manifest().target.model
    if model is None or not Path(model).is_dir():
        what = "no target.model" if model is None else f"target.model {model!r} is not a model folder"
        return (
            f"live localize needs the served model's folder (its tokenizer or config.json) and a Python engine "
            f"to reach inside (SGLang, vLLM, speedtrap serve); {what}"
        )
    return None


def live_localize_stage(
    ctx: Context, culprits: Sequence[tuple[str, ...]], triage_json: dict[str, Any] | None = None
) -> None:
    """Each culprit set localized inside the manifest's own stack (``localize.localize_on_stack``): the base
    launched and captured once (kept in ``localize/live/``), then each culprit's configuration, one stack at a
    time; the layer diff and the scale check stored as for in-process targets, with which stack, role and
    mechanism measured them."""
    from speedtrap.localize import LiveRequest, folder_ids
    from speedtrap.stack import Launcher

    manifest = ctx.server_manifest()
    api: Literal["sglang", "openai"] = "sglang" if manifest.probe.api == "sglang" else "openai"
    model = manifest.probe.model or manifest.target.served_model
    values = None if ctx.settings.scale_values is None else tuple(ctx.settings.scale_values)
    ids = tuple(folder_ids(manifest.target.model, ctx.settings.tokens))
    request = LiveRequest(ids, api=api, model=model, param=ctx.source.symbol, values=values)
    factors = {patches: scale_factor(ctx, triage_json, patches) for patches in culprits}
    ctx.progress.start("localize", sum(2 if factors[p] else 1 for p in culprits))
    launcher = Launcher(manifest.target, manifest.patches, model)
    try:
        for patches in culprits:
            own = dataclasses.replace(request, param=factors[patches])
            _LiveCulprit(ctx, launcher, patches, own).store()
    finally:
        launcher.close()


class _LiveCulprit:
    """One culprit's live localize, measured on first need and stored as a layers part and a scale part."""

    def __init__(self, ctx: Context, launcher: Any, patches: tuple[str, ...], request: Any) -> None:
        self.ctx, self.launcher, self.patches, self.request = ctx, launcher, patches, request
        self.result: Any = None

    def measured(self) -> Any:
        from speedtrap.localize import localize_on_stack

        if self.result is None:
            folder = self.ctx.run_dir / LOCALIZE_DIR / "live"
            self.result = localize_on_stack(self.launcher, self.patches, folder, self.request)
        return self.result

    def store(self) -> None:
        ctx, patches, tokens = self.ctx, self.patches, self.ctx.settings.tokens
        key = (sorted(patches), tokens, self.request.key())
        ctx.part(layers_path(ctx.run_dir, patches), ("layers-live", *key), self.make_layers)
        ctx.progress.advance("localize", 1, f"live layer diff {' + '.join(patches)}")
        symbol = self.request.param
        if not symbol:
            return
        path, parts = scale_path(ctx.run_dir, patches), ("scale-live", *key)
        stored = ctx.stored(path, stable_key(ctx.base_key(), *parts))
        if stored is None and self.measured().shown.scale is None:  # nothing holds the factor: said, not stored
            notes = [n for n in self.measured().notes if "scale check" in n]
            why = "; ".join(notes) or f"no module of the stack holds {symbol!r} at its config value"
            ctx.progress.advance("localize", 1, f"live scale check {' + '.join(patches)}: {why}")
            return
        ctx.part(path, parts, self.make_scale)
        ctx.progress.advance("localize", 1, f"live scale check {' + '.join(patches)}")

    def make_layers(self, key: str) -> Part:
        result = self.measured()
        command = commands.layers(self.ctx.source, self.patches, self.ctx.settings.tokens)
        layers = result.shown.layers.to_json()
        return Part("layers", layers, patches=self.patches, command=command, extra=result.extra())

    def make_scale(self, key: str) -> Part:
        result = self.measured()
        scale = result.shown.scale
        assert scale is not None  # store() checked
        values = self.request.values
        command = commands.scale(self.ctx.source, self.patches, self.ctx.settings.tokens, values, self.request.param)
        return Part("scale", scale.to_json(), patches=self.patches, command=command, extra=result.extra())
