"""``--bisect-on-fail``: a failing gate goes straight on to the culprit search, against the same recording."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._errors import UsageError
from speedtrap.isolate import IsolateResult, isolate
from speedtrap.manifest import Manifest, ProbeSpec, VerdictSpec
from speedtrap.progress import Progress
from speedtrap.regress._check import Check

if TYPE_CHECKING:
    from speedtrap.targets import InProcessModel


def manifest_without_rule(manifest: Manifest) -> Manifest:
    """The manifest with its probe and verdict set aside (the gate supplies both, from the recording and the
    failed bound), so a manifest without ``verdict.bound`` launches and hunts too; ``verdict.repeats`` kept
    where a verdict was written, the probe's ``api`` and ``model`` kept."""
    repeats = manifest.verdict_spec.repeats if manifest.verdict_spec is not None else VerdictSpec().repeats
    return dataclasses.replace(
        manifest,
        probe=ProbeSpec(api=manifest.probe.api, model=manifest.probe.model),
        verdict_spec=VerdictSpec(metric="failed-bound", bound=0.0, repeats=repeats),
        verdict_problem=None,
    )


def hunt_manifest(written: Manifest, recording: Any, failures: Sequence[Check]) -> Manifest:
    """The manifest the hunt runs: the recording as the baseline, the first failed bound as the rule.

    The manifest's ``probe.api`` and ``probe.model`` are kept: they say how the target is asked (a vLLM
    router that takes prompt logprobs from its prefill needs ``api = "vllm"``; asked the OpenAI way, the
    decode's echo answers them and a prefill-only culprit hides in the decode phase).
    """
    failed = next((c for c in failures if c.probe == "divergence"), None) or (failures[0] if failures else None)
    if failed is None:
        raise UsageError("nothing failed, nothing to bisect", "drop --bisect-on-fail")
    manifest = manifest_without_rule(written)
    api, model = manifest.probe.api, manifest.probe.model
    if failed.limit is not None:
        limit = failed.limit
        probe = ProbeSpec(
            "divergence", None, recording.divergence.to_json(), reference=str(recording.path), api=api, model=model
        )
        verdict = VerdictSpec.of_bound(limit, near=0.0, repeats=0)
    else:
        probe = ProbeSpec("recall", None, recording.recall.to_json(), api=api, model=model)
        verdict = VerdictSpec("recall_drop", "accuracy", 0.0, "below", 0.25, manifest.verdict.repeats)
    return dataclasses.replace(manifest, probe=probe, verdict_spec=verdict, verdict_problem=None)


def bisect_manifest(
    written: Manifest,
    recording: Any,
    failures: Sequence[Check],
    run_dir: Path | None,
    progress: Progress | None = None,
    model: InProcessModel | None = None,
) -> IsolateResult:
    """Isolate the manifest's patches with the recording as the baseline and the first failed bound as the rule.

    A failed divergence bound searches by divergence against the recording (no reference server);
    a failed recall check searches by recall with the recorded settings (rule ``recall_drop``).
    ``model``: an in-process model already loaded for the manifest's target (else it is loaded).
    """
    manifest = hunt_manifest(written, recording, failures)
    loaded = model if manifest.target.in_process else None  # the gate's loaded model, when it is the same target
    return isolate(manifest, run_dir, model=loaded, progress=progress)
