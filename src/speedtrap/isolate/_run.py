"""One isolate run: manifest -> oracle, store, evaluator, search -> result (kept in the run directory)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._errors import ManifestError, SpeedtrapError, UsageError
from speedtrap.isolate._commit_relations import CommitRelations, declared_relations, describe_commit_patches, merged
from speedtrap.isolate._evaluate import Evaluator
from speedtrap.isolate._executor import Executor, LocalExecutor, Oracle, ThreadExecutor
from speedtrap.isolate._oracle import InProcessOracle, ServerOracle, divergence_goal, load_target_model
from speedtrap.isolate._relations import Relations
from speedtrap.isolate._results import IsolateResult, Trial
from speedtrap.isolate._rules import rule_from_spec
from speedtrap.isolate._search import Search, SearchProgress
from speedtrap.isolate._store import TrialStore
from speedtrap.manifest import Manifest, ProbeSpec, VerdictSpec
from speedtrap.progress import NoProgress, Progress
from speedtrap.stack import PatchSpec, TargetSpec, check_relations

if TYPE_CHECKING:
    from speedtrap.targets import InProcessModel

RESULT_NAME = "result.json"
UNGATED_NOTE = (
    "ungated patches ({names}) cannot be switched off: they are on in every trial, the baseline included, "
    "so isolate cannot blame or clear them; if the baseline fails, suspect them first (triage reads their diffs) "
    "and rebuild without them to test"
)


TRIALS_TASK = "isolate"
SUSPECTS_TASK = "suspects left"


class _ProgressHooks:
    """The search's callbacks as progress: trials run (total unknown) and suspects left."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.total: int | None = None
        self.cleared = 0

    def on_trial(self, trial: Trial) -> None:
        self.progress.advance(TRIALS_TASK, 1, " + ".join(trial.config) or "baseline")

    def on_search(self, state: SearchProgress) -> None:
        total = max(1, state.total)
        if total != self.total:
            self.progress.start(SUSPECTS_TASK, total)
            self.total = total
        cleared = total - min(state.suspects_left, total)
        if cleared != self.cleared:
            self.progress.advance(SUSPECTS_TASK, cleared - self.cleared)
            self.cleared = cleared


def manifest_for_target(
    name: str,
    patches: Sequence[str] | None = None,
    overrides: dict[str, str] | None = None,
    probe: ProbeSpec | None = None,
    verdict: VerdictSpec | None = None,
    prior: Sequence[str] = (),
) -> Manifest:
    """The manifest ``speedtrap bisect --target NAME`` builds: an in-process target's patches by name."""
    specs = tuple(PatchSpec(p) for p in patches) if patches is not None else ()
    return Manifest(
        None,
        TargetSpec(name=name, overrides=tuple(sorted((overrides or {}).items()))),
        specs,
        probe or ProbeSpec(),
        verdict or VerdictSpec(),
        tuple(prior),
    )


def searched_names(manifest: Manifest) -> tuple[str, ...]:
    """The patch names the manifest lists (user ``module:function`` patches are loaded from these)."""
    return tuple(p.name for p in manifest.patches)


def load_in_process(manifest: Manifest) -> InProcessModel:
    """Load the manifest's in-process target, the user patches it names in its catalogue."""
    return load_target_model(manifest.target, searched_names(manifest))


def _in_process_patches(manifest: Manifest, model: InProcessModel) -> tuple[PatchSpec, ...]:
    from speedtrap.targets import user_patches

    model.add_patches(user_patches(searched_names(manifest)))  # a model loaded by the caller gets them too
    catalog = [p.info.name for p in model.catalog]
    if not manifest.patches:  # the target's own patches (not the extra constructed ones)
        base = {i.name for i in _base_infos(manifest)}
        return tuple(PatchSpec(n) for n in catalog if n in base)
    for i, p in enumerate(manifest.patches):
        if p.name not in catalog:
            raise ManifestError(
                f"patches[{i}].name {p.name!r} is not a patch of {manifest.target.name}",
                f"choose from: {', '.join(catalog)}",
            )
    return manifest.patches


def _base_infos(manifest: Manifest) -> list[Any]:
    from speedtrap.targets import resolve_target

    return resolve_target(str(manifest.target.name)).patch_infos()


def isolate(
    manifest: Manifest,
    run_dir: Path | None,
    resume: bool = False,
    model: InProcessModel | None = None,
    executor: Executor | None = None,
    progress: Progress | None = None,
    check_interactions: bool = True,
    oracle: Oracle | None = None,
) -> IsolateResult:
    """Find the culprit patch sets of ``manifest``'s target; trials are kept in ``run_dir``.

    Without ``executor``, the one the manifest's ``[search]`` table asks for is made (and closed
    at the end); a caller's executor is left open.
    """
    owned = executor is None
    executor = executor if executor is not None else make_executor(manifest)
    try:
        hooks = _ProgressHooks(progress or NoProgress())
        return _isolate(manifest, run_dir, resume, model, executor, hooks, check_interactions, oracle)
    finally:
        if owned:
            executor.close()


def _isolate(
    manifest: Manifest,
    run_dir: Path | None,
    resume: bool,
    model: InProcessModel | None,
    executor: Executor,
    hooks: _ProgressHooks,
    check_interactions: bool,
    oracle: Oracle | None,
) -> IsolateResult:
    patches = manifest.patches
    if oracle is None:
        if manifest.target.in_process:
            model = model if model is not None else load_in_process(manifest)
            patches = _in_process_patches(manifest, model)
            check_relations(patches)
            always = [p.name for p in patches if p.ungated]
            goal = divergence_goal(manifest.verdict)
            oracle = InProcessOracle(model, manifest.target, manifest.probe, always, searched_names(manifest), goal)
        else:
            if not patches:
                raise ManifestError("manifest has no [[patches]] tables", "add one [[patches]] table per patch")
            oracle = ServerOracle(manifest.target, patches, manifest.probe, goal=divergence_goal(manifest.verdict))
    if isinstance(oracle, ServerOracle) and isinstance(executor, ThreadExecutor):
        oracle.allow(executor.capacity)  # search.parallel stacks at once, from threads of this process
    names = [p.name for p in patches]
    for i, name in enumerate(manifest.prior):
        if name not in names:
            raise ManifestError(f"search.prior[{i}] names no patch: {name!r}", f"choose from: {', '.join(names)}")
    commits = CommitRelations.read(manifest.target, patches)
    searchable = [p.name for p in patches if not p.ungated and p.name not in commits.unusable]
    if commits.window is not None:
        searchable = list(commits.window)
    ungated = tuple(p.name for p in patches if p.ungated)
    requires, conflicts = merged(patches, commits.requires, commits.conflicts)
    relations = Relations(requires=requires, conflicts=_symmetric(conflicts))
    rule = rule_from_spec(manifest.verdict)
    failovers_before = getattr(executor, "failovers", 0)
    prepare = getattr(oracle, "prepare", None)  # a recorded baseline is made (or loaded) before any trial
    if prepare is not None:
        try:
            prepare(run_dir)
        except BaseException:
            oracle.close()
            raise
    store = TrialStore(run_dir)
    try:
        identity = {
            "oracle": oracle.identity(),
            "rule": rule.to_json(),
            "repeats": manifest.verdict.repeats,
            "patches": [p.to_json() for p in patches],
            "prior": list(manifest.prior),
        }
        run_id, _continued = store.begin_run(identity, manifest.to_json(), resume)
        evaluator = Evaluator(
            oracle,
            rule,
            store,
            run_id,
            repeats=manifest.verdict.repeats,
            retries=0 if manifest.target.in_process else manifest.target.retries,
            executor=executor,
            trial_dir=(run_dir / "trials") if run_dir is not None else None,
            on_trial=hooks.on_trial,
        )
        search = Search(
            searchable,
            commits.judge(evaluator),
            relations,
            prior=manifest.prior,
            capacity=evaluator.capacity,
            check_interactions=check_interactions,
            progress=hooks.on_search,
            recheck=evaluator.recheck if manifest.verdict.repeats > 0 else None,
            history=commits.window is not None,
        )
        try:
            result = search.run()
        except SpeedtrapError:
            store.finish_run(run_id, "aborted", None)
            raise
        commits.read_window_requires(patches)
        notes = [*result.notes, *commits.notes(), *evaluator.notes]
        if ungated:
            notes.append(UNGATED_NOTE.format(names=", ".join(ungated)))
        role_nodes = getattr(executor, "role_nodes", None)  # roles each on its own Ray node: where they ran
        placed_on = role_nodes() if role_nodes is not None else []
        if placed_on:
            notes.append("the stack's roles ran on: " + "; ".join(placed_on))
        failovers = getattr(executor, "failovers", 0) - failovers_before
        if failovers:
            notes.append(f"{failovers} trial(s) ran again on a fresh worker after theirs died mid-trial")
        recorded = getattr(oracle, "recording_launches", 0)
        if recorded:
            notes.append(
                f"the baseline configuration was recorded ({recorded} launch, stopped before the trials); every "
                "divergence trial was compared with the recording, so at most one server ran at a time"
            )
        refs = getattr(oracle, "reference_launches", 0)
        if refs:
            notes.append(
                f"the reference (baseline) server was launched {refs} time(s) for divergence, besides the trials"
            )
        result = dataclasses.replace(
            result,
            ungated=ungated,
            trials=tuple(evaluator.trials),
            launches=evaluator.launches,
            reused=evaluator.reused,
            rule={**rule.to_json(), "repeats": manifest.verdict.repeats},
            target=manifest.target.to_json(),
            notes=tuple(notes),
            not_searched={**result.not_searched, **commits.unusable},
            relations=(*declared_relations(patches), *commits.relations),
            commits=describe_commit_patches(manifest.target, patches),
        )
        store.finish_run(run_id, result.status.value, result.to_json())
        if run_dir is not None:
            (run_dir / RESULT_NAME).write_text(json.dumps(result.to_json(), indent=1))
        return result
    finally:
        oracle.close()
        store.close()
        commits.close()


def make_executor(manifest: Manifest, workers: int | None = None) -> Executor:
    """The executor the manifest asks for (``[search] executor``, ``parallel``, ``address``, ``resources``).

    ``workers`` overrides ``parallel``; for Ray, when neither is set, as many workers as the
    cluster's resources hold.
    """
    count = workers if workers is not None else manifest.parallel
    if count < 1:
        raise UsageError(f"--workers {count} must be at least 1", "pass --workers 1 or more")
    if manifest.executor == "ray":
        from speedtrap.isolate._ray import RayExecutor, TrialResources

        resources = TrialResources.from_table(dict(manifest.resources))
        explicit = workers if workers is not None else (manifest.parallel if manifest.parallel > 1 else None)
        return RayExecutor(manifest.address, explicit, resources)
    if count > 1:
        if manifest.target.in_process:
            raise ManifestError(
                f"{count} trials at once need a server target or Ray (one in-process model runs one trial)",
                "drop search.parallel / --workers, launch servers (target.launch), or use --executor ray",
            )
        return ThreadExecutor(count)
    return LocalExecutor()


def _symmetric(conflicts: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    out: dict[str, set[str]] = {}
    for a, others in conflicts.items():
        for b in others:
            out.setdefault(a, set()).add(b)
            out.setdefault(b, set()).add(a)
    return {k: tuple(sorted(v)) for k, v in out.items()}
