"""Isolate: find the minimal patch sets that break a stack, relaunching it per configuration.

::

    from speedtrap.isolate import isolate, load_isolate_manifest
    result = isolate(load_isolate_manifest(Path("speedtrap.toml")), Path("runs/x"))
    print(result.summary())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speedtrap._lazy import lazy_getattr
from speedtrap._stats import wilson
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

if TYPE_CHECKING:
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
    from speedtrap.isolate._roles import RoleSpec, StackSpec
    from speedtrap.isolate._rules import RecallDropRule, Rule, ThresholdRule, rule_from_spec
    from speedtrap.isolate._run import isolate, load_in_process, make_executor, manifest_for_target
    from speedtrap.isolate._search import Search, SearchProgress
    from speedtrap.isolate._stack import Stack, read_records
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

# The rest loads on first use, so that reading the result types loads no stage machinery.
_LAZY = {
    "CommandNotFound": "speedtrap.isolate._launch",
    "CommitConflict": "speedtrap.isolate._commits",
    "CommitTrees": "speedtrap.isolate._commits",
    "DEFAULT_PROBE": "speedtrap.isolate._defaults",
    "DEFAULT_VERDICT": "speedtrap.isolate._defaults",
    "Evaluator": "speedtrap.isolate._evaluate",
    "Executor": "speedtrap.isolate._executor",
    "FunctionOracle": "speedtrap.isolate._oracle",
    "InProcessOracle": "speedtrap.isolate._oracle",
    "IsolateManifest": "speedtrap.isolate._manifest",
    "LaunchSpec": "speedtrap.isolate._launch",
    "LocalExecutor": "speedtrap.isolate._executor",
    "Measurement": "speedtrap.isolate._executor",
    "Oracle": "speedtrap.isolate._executor",
    "OracleRecipe": "speedtrap.isolate._executor",
    "PatchSpec": "speedtrap.isolate._manifest",
    "ProbeSpec": "speedtrap.isolate._manifest",
    "RayExecutor": "speedtrap.isolate._ray",
    "RecallDropRule": "speedtrap.isolate._rules",
    "Relations": "speedtrap.isolate._relations",
    "RoleSpec": "speedtrap.isolate._roles",
    "Rule": "speedtrap.isolate._rules",
    "Search": "speedtrap.isolate._search",
    "SearchProgress": "speedtrap.isolate._search",
    "Server": "speedtrap.isolate._launch",
    "ServerOracle": "speedtrap.isolate._oracle",
    "Stack": "speedtrap.isolate._stack",
    "StackSpec": "speedtrap.isolate._roles",
    "TargetSpec": "speedtrap.isolate._manifest",
    "ThreadExecutor": "speedtrap.isolate._executor",
    "ThresholdRule": "speedtrap.isolate._rules",
    "TrialOutcome": "speedtrap.isolate._executor",
    "TrialRequest": "speedtrap.isolate._executor",
    "TrialResources": "speedtrap.isolate._ray",
    "TrialStore": "speedtrap.isolate._store",
    "VerdictSpec": "speedtrap.isolate._manifest",
    "Worktrees": "speedtrap.isolate._worktree",
    "build_manifest": "speedtrap.isolate._defaults",
    "commit_order": "speedtrap.isolate._worktree",
    "commit_target_fields": "speedtrap.isolate._worktree",
    "default_run_dir": "speedtrap.isolate._defaults",
    "free_port": "speedtrap.isolate._launch",
    "isolate": "speedtrap.isolate._run",
    "launch": "speedtrap.isolate._launch",
    "load_in_process": "speedtrap.isolate._run",
    "load_isolate_manifest": "speedtrap.isolate._manifest",
    "make_executor": "speedtrap.isolate._run",
    "manifest_for_target": "speedtrap.isolate._run",
    "manifest_stack": "speedtrap.isolate._manifest",
    "minimal_transversals": "speedtrap.isolate._relations",
    "oracle_recipe": "speedtrap.isolate._executor",
    "parse_manifest": "speedtrap.isolate._manifest",
    "parse_patches": "speedtrap.isolate._manifest",
    "read_records": "speedtrap.isolate._stack",
    "report_figures": "speedtrap.isolate._oracle",
    "resolve_commits_in": "speedtrap.isolate._worktree",
    "rule_from_spec": "speedtrap.isolate._rules",
    "run_trial": "speedtrap.isolate._executor",
    "scan_relations": "speedtrap.isolate._worktree",
    "stored_trials": "speedtrap.isolate._store",
    "trial_key": "speedtrap.isolate._store",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
