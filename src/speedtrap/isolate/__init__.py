"""Isolate: find the minimal patch sets that break a stack, relaunching it per configuration.

::

    from speedtrap.isolate import isolate
    from speedtrap.manifest import load_manifest
    result = isolate(load_manifest(Path("speedtrap.toml")), Path("runs/x"))
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
    from speedtrap.isolate._commit_relations import scan_relations
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
    from speedtrap.isolate._oracle import FunctionOracle, InProcessOracle, ServerOracle, report_figures
    from speedtrap.isolate._ray import RayExecutor, TrialResources
    from speedtrap.isolate._reference import RECORDING_NAME
    from speedtrap.isolate._relations import Relations, minimal_transversals
    from speedtrap.isolate._rules import RecallDropRule, Rule, ThresholdRule, rule_from_spec
    from speedtrap.isolate._run import isolate, load_in_process, make_executor, manifest_for_target
    from speedtrap.isolate._search import Search, SearchProgress
    from speedtrap.isolate._store import TrialStore, stored_trials, trial_key

__all__ = [
    "DEFAULT_PROBE",
    "DEFAULT_VERDICT",
    "RECORDING_NAME",
    "CommitPatch",
    "Conclusion",
    "CulpritSet",
    "Evaluator",
    "Executor",
    "FunctionOracle",
    "InProcessOracle",
    "Interaction",
    "InteractionKind",
    "IsolateResult",
    "Judgement",
    "LocalExecutor",
    "Measurement",
    "Oracle",
    "OracleRecipe",
    "Outcome",
    "PatchRelation",
    "RayExecutor",
    "RecallDropRule",
    "Relations",
    "Rule",
    "Search",
    "SearchProgress",
    "ServerOracle",
    "Status",
    "ThreadExecutor",
    "ThresholdRule",
    "Trial",
    "TrialOutcome",
    "TrialRequest",
    "TrialResources",
    "TrialStore",
    "build_manifest",
    "default_run_dir",
    "isolate",
    "load_in_process",
    "make_executor",
    "manifest_for_target",
    "minimal_transversals",
    "oracle_recipe",
    "report_figures",
    "rule_from_spec",
    "run_trial",
    "scan_relations",
    "stored_trials",
    "trial_key",
    "wilson",
]

# The rest loads on first use, so that reading the result types loads no stage machinery.
_LAZY = {
    "DEFAULT_PROBE": "speedtrap.isolate._defaults",
    "DEFAULT_VERDICT": "speedtrap.isolate._defaults",
    "RECORDING_NAME": "speedtrap.isolate._reference",
    "Evaluator": "speedtrap.isolate._evaluate",
    "Executor": "speedtrap.isolate._executor",
    "FunctionOracle": "speedtrap.isolate._oracle",
    "InProcessOracle": "speedtrap.isolate._oracle",
    "LocalExecutor": "speedtrap.isolate._executor",
    "Measurement": "speedtrap.isolate._executor",
    "Oracle": "speedtrap.isolate._executor",
    "OracleRecipe": "speedtrap.isolate._executor",
    "RayExecutor": "speedtrap.isolate._ray",
    "RecallDropRule": "speedtrap.isolate._rules",
    "Relations": "speedtrap.isolate._relations",
    "Rule": "speedtrap.isolate._rules",
    "Search": "speedtrap.isolate._search",
    "SearchProgress": "speedtrap.isolate._search",
    "ServerOracle": "speedtrap.isolate._oracle",
    "ThreadExecutor": "speedtrap.isolate._executor",
    "ThresholdRule": "speedtrap.isolate._rules",
    "TrialOutcome": "speedtrap.isolate._executor",
    "TrialRequest": "speedtrap.isolate._executor",
    "TrialResources": "speedtrap.isolate._ray",
    "TrialStore": "speedtrap.isolate._store",
    "build_manifest": "speedtrap.isolate._defaults",
    "default_run_dir": "speedtrap.isolate._defaults",
    "isolate": "speedtrap.isolate._run",
    "load_in_process": "speedtrap.isolate._run",
    "make_executor": "speedtrap.isolate._run",
    "manifest_for_target": "speedtrap.isolate._run",
    "minimal_transversals": "speedtrap.isolate._relations",
    "oracle_recipe": "speedtrap.isolate._executor",
    "report_figures": "speedtrap.isolate._oracle",
    "rule_from_spec": "speedtrap.isolate._rules",
    "run_trial": "speedtrap.isolate._executor",
    "scan_relations": "speedtrap.isolate._commit_relations",
    "stored_trials": "speedtrap.isolate._store",
    "trial_key": "speedtrap.isolate._store",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
