"""Isolate: find the minimal patch sets that break a stack, relaunching it per configuration.

::

    from speedtrap.isolate import isolate, load_isolate_manifest
    result = isolate(load_isolate_manifest(Path("speedtrap.toml")), Path("runs/x"))
    print(result.summary())
"""

from __future__ import annotations

from speedtrap._stats import wilson
from speedtrap.isolate._commits import CommitConflict, CommitTrees
from speedtrap.isolate._defaults import DEFAULT_PROBE, DEFAULT_VERDICT, build_manifest, default_run_dir
from speedtrap.isolate._evaluate import Evaluator
from speedtrap.isolate._executor import (
    Executor,
    LocalExecutor,
    Measurement,
    Oracle,
    OracleRecipe,
    ThreadExecutor,
    TrialOutcome,
    TrialRequest,
    oracle_recipe,
    run_trial,
)
from speedtrap.isolate._launch import CommandNotFound, LaunchSpec, Server, free_port, launch
from speedtrap.isolate._manifest import (
    IsolateManifest,
    PatchSpec,
    ProbeSpec,
    TargetSpec,
    VerdictSpec,
    load_isolate_manifest,
    manifest_stack,
    parse_manifest,
    parse_patches,
)
from speedtrap.isolate._oracle import FunctionOracle, InProcessOracle, ServerOracle, report_figures
from speedtrap.isolate._ray import RayExecutor, TrialResources
from speedtrap.isolate._relations import Relations, minimal_transversals
from speedtrap.isolate._results import (
    CommitPatch,
    Conclusion,
    CulpritSet,
    Interaction,
    InteractionKind,
    IsolateResult,
    Judgement,
    Outcome,
    PatchRelation,
    Status,
    Trial,
)
from speedtrap.isolate._roles import RoleSpec, Stack, StackSpec, read_records
from speedtrap.isolate._rules import RecallDropRule, Rule, ThresholdRule, rule_from_spec
from speedtrap.isolate._run import isolate, load_in_process, make_executor, manifest_for_target
from speedtrap.isolate._search import Search, SearchProgress
from speedtrap.isolate._store import TrialStore, stored_trials, trial_key
from speedtrap.isolate._worktree import (
    Worktrees,
    commit_order,
    commit_target_fields,
    resolve_commits_in,
    scan_relations,
)

__all__ = [
    "DEFAULT_PROBE",
    "DEFAULT_VERDICT",
    "CommandNotFound",
    "CommitConflict",
    "CommitPatch",
    "CommitTrees",
    "Conclusion",
    "CulpritSet",
    "Evaluator",
    "Executor",
    "FunctionOracle",
    "InProcessOracle",
    "Interaction",
    "InteractionKind",
    "IsolateManifest",
    "IsolateResult",
    "Judgement",
    "LaunchSpec",
    "LocalExecutor",
    "Measurement",
    "Oracle",
    "OracleRecipe",
    "Outcome",
    "PatchRelation",
    "PatchSpec",
    "ProbeSpec",
    "RayExecutor",
    "RecallDropRule",
    "Relations",
    "RoleSpec",
    "Rule",
    "Search",
    "SearchProgress",
    "Server",
    "ServerOracle",
    "Stack",
    "StackSpec",
    "Status",
    "TargetSpec",
    "ThreadExecutor",
    "ThresholdRule",
    "Trial",
    "TrialOutcome",
    "TrialRequest",
    "TrialResources",
    "TrialStore",
    "VerdictSpec",
    "Worktrees",
    "build_manifest",
    "commit_order",
    "commit_target_fields",
    "default_run_dir",
    "free_port",
    "isolate",
    "launch",
    "load_in_process",
    "load_isolate_manifest",
    "make_executor",
    "manifest_for_target",
    "manifest_stack",
    "minimal_transversals",
    "oracle_recipe",
    "parse_manifest",
    "parse_patches",
    "read_records",
    "report_figures",
    "resolve_commits_in",
    "rule_from_spec",
    "run_trial",
    "scan_relations",
    "stored_trials",
    "trial_key",
    "wilson",
]
