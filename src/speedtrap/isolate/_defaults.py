"""What ``speedtrap bisect`` uses when the command line leaves it open: probe, verdict, run directory."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from speedtrap._errors import UsageError
from speedtrap.isolate._run import manifest_for_target
from speedtrap.isolate._store import stable_hash
from speedtrap.manifest import Manifest, ProbeSpec, VerdictSpec, load_manifest
from speedtrap.probe import NoiseFloor
from speedtrap.spec import DEFAULT_BOUND, DEFAULT_MARGIN, Bound
from speedtrap.targets import parse_overrides

RUNS_DIR = "speedtrap-runs"

# In-process default: teacher-forced divergence (cheap, sees prefill and decode), failing on the
# worst phase's p99 KL. Measured on smol-moe: see the README's isolate section.
DEFAULT_PROBE = ProbeSpec(kind="divergence", preset="quick")
DEFAULT_VERDICT = VerdictSpec.of_bound(DEFAULT_BOUND, near=0.25)  # worst.kl_p99 <= 0.1, as check --against
RECALL_VERDICT = VerdictSpec(rule="recall_drop", metric="accuracy", direction="below")


def build_manifest(
    target: str | None,
    manifest: Path | None,
    patches: Sequence[str] | None,
    sets: Sequence[str],
    probe: str | None,
    metric: str | None,
    bound: float | None,
    repeats: int | None,
    prior: Sequence[str],
    floor: NoiseFloor | None = None,
    margin: float = DEFAULT_MARGIN,
) -> Manifest:
    """The manifest of a ``bisect`` command line (``--manifest FILE`` or ``--target NAME`` + options).

    The bound: ``--bound`` wins; else a noise floor (``--floor``) derives it (see NoiseFloor.bound);
    else the manifest's, or the default.
    """
    if manifest is not None:
        spec = load_manifest(manifest)
    else:
        overrides = parse_overrides(sets)
        if probe not in (None, "divergence", "recall"):
            raise UsageError(f"--probe {probe!r} is not divergence or recall", "choose --probe divergence")
        probe_spec = dataclasses.replace(DEFAULT_PROBE, kind=probe or "divergence")
        verdict = RECALL_VERDICT if probe == "recall" else DEFAULT_VERDICT
        spec = manifest_for_target(str(target), patches, overrides, probe_spec, verdict, prior)
    verdict = spec.verdict
    if metric is not None:
        verdict = dataclasses.replace(verdict, metric=metric)
    if bound is not None:
        verdict = dataclasses.replace(verdict, bound=bound, origin="")
    elif floor is not None:
        verdict = with_floor(verdict, floor, margin)
    if repeats is not None:
        if repeats < 0:
            raise UsageError(f"--repeats {repeats} is negative", "give 0 or more")
        verdict = dataclasses.replace(verdict, repeats=repeats)
    if prior and manifest is not None:
        spec = dataclasses.replace(spec, prior=tuple(prior))
    return dataclasses.replace(spec, verdict_spec=verdict, verdict_problem=None)


def with_floor(verdict: VerdictSpec, floor: NoiseFloor, margin: float = DEFAULT_MARGIN) -> VerdictSpec:
    """The verdict with its bound derived from a measured noise floor (a threshold on a KL figure, above)."""
    if verdict.rule != "threshold" or verdict.direction != "above":
        raise UsageError(
            f"a noise floor bounds a threshold rule failing above, not {verdict.rule}/{verdict.direction}",
            "drop --floor, or use --probe divergence",
        )
    derived = Bound.from_floor(floor, verdict.metric, margin)
    return dataclasses.replace(verdict, bound=derived.value, origin=derived.origin)


def default_run_dir(spec: Manifest) -> Path:
    """``speedtrap-runs/bisect-<target>-<hash>``: the same target and probe find their earlier trials again."""
    name = spec.target.name or Path(spec.target.launch[0]).name
    # Not the verdict or the search order: trials are reused across them (their figures do not change).
    digest = stable_hash({k: v for k, v in spec.to_json().items() if k not in ("path", "verdict", "prior")})[:10]
    return Path(RUNS_DIR) / f"bisect-{name}-{digest}"
