"""``speedtrap.toml``, read once: the target, its patches, the probe, the verdict rule and the search.

Every stage (triage, isolate, the CI gate, localize, inspect, ``run``) takes the :class:`Manifest` this
module returns; none reads the file again. The top level holds the tables below and ``tree`` (triage's
source tree); an unknown table or key is an error that names it and the nearest known name, so a typo
(``[verdcit]``, ``[serach]``) never runs a search with silent defaults. A manifest triage reads alone
may have no ``[target]``; the stages that launch ask for it and name the missing table::

    tree = "../sglang/python"      # optional: the source tree the diffs apply to (triage)

    [target]                       # either an in-process target ...
    name = "smol-moe"
    overrides = { routed_scaling_factor = "2.5" }
    # ... or a server launched per configuration (argv, never a shell):
    launch = ["python", "-m", "llama_cpp.server", "--model", "{model}", "--port", "{port}"]
    model = "models/x.gguf"        # fills {model}; relative to the manifest
    health = "http://127.0.0.1:{port}/v1/models"
    served_model = "x"             # the model name the API expects
    start_timeout = 120            # seconds until healthy
    stop_timeout = 10              # seconds between SIGTERM and SIGKILL
    env = { OMP_NUM_THREADS = "2" }
    config_args = ["--set", "{key}={value}"]   # how a config-gated patch becomes launch arguments
    retries = 1                    # relaunches of a trial whose server dies
    platform = "cuda"              # the hardware it is served on: triage demotes code it cannot select

    [[patches]]
    name = "fp8_kv_cache"
    env = { SPEEDTRAP_SMOLMOE_FP8_KV_CACHE = "1" }
    args = ["--type_k", "8"]
    requires = []                  # patches that must be on with it
    conflicts = []                 # patches that cannot be on with it
    gate = "ungated"               # compiled in: listed, always on, never toggled

    [probe]
    kind = "divergence"            # divergence | recall | command
    preset = "quick"               # start from the probe's quick settings
    settings = { ... }             # fields of the probe's settings, by name
    argv = ["python", "eval.py", "{base_url}"]  # kind = "command": prints one JSON object of figures
    reference = "recorded"         # divergence baseline: recorded (default) | live | a recording's path
    api = "vllm"                   # server targets: prompt logprobs via openai echo | vllm | sglang
    model = "smollm2"              # server targets: the model name requests carry (default: served_model)

    [verdict]
    rule = "threshold"             # threshold | recall_drop
    metric = "worst.kl_p99"        # a figure the probe reports (the default; see speedtrap.spec.metric)
    bound = 0.1
    direction = "above"            # fail when the metric is above (or below) the bound
    near = 0.25                    # relative band around the bound that is repeated
    repeats = 2                    # extra trials for a verdict near the threshold
    sequential = true              # stop once decided: recall per length; divergence after its prefill round
    alpha = 0.05                   # sequential: the chance of calling a length lost that keeps its facts
    beta = 0.2                     # sequential: the chance of calling one kept that loses half its facts

    [search]
    prior = ["hash_topk_routed_scaling"]   # likely suspects first (triage's tiers)
    parallel = 1                   # trials at once: servers on threads, or Ray workers
    executor = "local"             # local | ray (pip install 'speedtrap[ray]')
    address = "10.0.0.1:6379"      # executor = "ray": the cluster; left out: a local one for the run
    resources = { num_gpus = 1 }   # executor = "ray": what one trial reserves (num_cpus, num_gpus, custom)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError, UsageError
from speedtrap._fields import integer, nearest, no_unknown, number, resolve, str_list, table
from speedtrap._toml import read_manifest_toml
from speedtrap.manifest._spec import (
    DIRECTIONS,
    EXECUTORS,
    PROBE_APIS,
    PROBE_KINDS,
    REFERENCE_MODES,
    RULES,
    Manifest,
    ProbeSpec,
    VerdictSpec,
)
from speedtrap.spec import DEFAULT_BOUND, Bound, parse_probe, polarity
from speedtrap.stack import (
    TargetSpec,
    commit_target_fields,
    parse_patches,
    parse_target,
    resolve_commit_patches,
    resolve_commits_in,
)

__all__ = ["TABLES", "load_manifest", "parse_manifest"]

TABLES = ("target", "patches", "probe", "verdict", "search", "tree")  # the manifest's top level

_PROBE_KEYS = {"kind", "preset", "settings", "argv", "timeout", "reference", "api", "model"}
_VERDICT_KEYS = {"rule", "metric", "bound", "direction", "near", "repeats", "margin", "alpha", "beta", "sequential"}
_SEARCH_KEYS = {"prior", "parallel", "executor", "address", "resources"}


# ----------------------------------------------------------------------------------------------
# Reading and checking.


def load_manifest(path: Path, *, resolve_commits: bool = True) -> Manifest:
    """Read and check a manifest; every problem is a :class:`ManifestError` naming the field.

    ``resolve_commits=False`` leaves commit patches as written (``inspect`` of a live stack whose repository
    may have moved since the launch: it resolves what it can itself)."""
    path = Path(path)
    data = read_manifest_toml(path)
    return parse_manifest(data, path.parent, path, resolve_commits=resolve_commits)


def check_tables(data: Mapping[str, Any]) -> None:
    """The top level holds only :data:`TABLES`; anything else is named with the nearest known table."""
    for key in data:
        if key not in TABLES:
            guess = nearest(str(key), TABLES)
            hint = f" (did you mean {guess!r}?)" if guess else ""
            raise ManifestError(f"unknown table {key!r}{hint}", f"a manifest holds only: {', '.join(TABLES)}")


def parse_manifest(
    data: Mapping[str, Any], base: Path, path: Path | None = None, *, resolve_commits: bool = True
) -> Manifest:
    """Check a parsed TOML document; relative paths are taken from ``base``.

    Inside every table an unknown key is an error too (a typo must not silently change a search).
    """
    check_tables(data)
    target: TargetSpec | None = None
    target_problem: tuple[str, str] | None = None
    repo: Path | None = None
    rev: str | None = None
    if "target" in data or "patches" not in data:  # neither: say what is launched first
        raw_target = table(data, "target", required=True)
        try:
            target = parse_target(raw_target, base, path)
        except ManifestError as exc:
            unlaunched = not raw_target.get("launch") and "name" not in raw_target and "roles" not in raw_target
            if "patches" not in data or not unlaunched:
                raise
            # no launch yet (``init --repo --range`` writes ``launch = []``; a [target] may hold only the repo
            # and base triage reads): triage still reads the patches and their commits; the stages that launch
            # raise this problem when they ask for the target
            target_problem = (exc.problem, exc.fix or "fill in [target]")
            fields = commit_target_fields(raw_target, base)
            repo, rev = fields["repo"], fields["base"]
    patches = parse_patches(
        data.get("patches"),
        base,
        required=target is None,  # a launched stack without patches is read (inspect, a gate); isolate asks
        stack=target.stack if target is not None else None,
    )
    if target is not None:
        repo, rev = target.repo, target.base
        if resolve_commits:
            target, patches = resolve_commit_patches(target, patches)
            rev = target.base
    elif repo is not None:
        if resolve_commits:
            repo, rev, patches = resolve_commits_in(repo, rev, patches)
    elif any(p.commit is not None for p in patches):
        raise ManifestError(
            "the manifest's patches are commits but it has no [target] naming their repository",
            'add [target] with repo = "path/to/checkout" and base = "<sha>"',
        )
    tree = data.get("tree")
    if tree is not None and (not isinstance(tree, str) or not tree):
        raise ManifestError("tree must be a path string", 'write tree = "path/to/source"')
    probe = _probe(table(data, "probe"), target, base)
    verdict, problem = _verdict(table(data, "verdict"), probe)
    search = table(data, "search")
    no_unknown(search, _SEARCH_KEYS, "search.", "search")
    prior = str_list(search.get("prior", []), "search.prior")
    names = {p.name for p in patches}
    for i, name in enumerate(prior):
        if patches and name not in names:
            raise ManifestError(
                f"search.prior[{i}] names no patch: {name!r}", f"choose from: {', '.join(sorted(names))}"
            )
    parallel = integer(search.get("parallel", 1), "search.parallel", minimum=1)
    executor = search.get("executor", "local")
    if executor not in EXECUTORS:
        raise ManifestError(f"search.executor {executor!r} is not one of {', '.join(EXECUTORS)}", 'write "ray"')
    address = search.get("address")
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise ManifestError("search.address must be a non-empty string", 'write e.g. address = "10.0.0.1:6379"')
    resources = []
    for key, value in table(search, "resources").items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ManifestError(f"search.resources.{key} = {value!r} is not a non-negative number", f"write {key} = 1")
        resources.append((str(key), float(value)))
    return Manifest(
        path,
        target,
        patches,
        probe,
        verdict,
        tuple(prior),
        parallel,
        executor,
        address,
        tuple(resources),
        tree=resolve(base, tree) if tree else None,
        verdict_problem=problem,
        target_problem=target_problem,
        repo=repo,
        base=rev,
    )


def _probe(raw: Mapping[str, Any], target: TargetSpec | None, base: Path) -> ProbeSpec:
    no_unknown(raw, _PROBE_KEYS, "probe.", "probe")
    kind = raw.get("kind", "divergence")
    if kind not in PROBE_KINDS:
        raise ManifestError(f"probe.kind {kind!r} is not one of {', '.join(PROBE_KINDS)}", 'write kind = "divergence"')
    preset = raw.get("preset", "quick")
    if preset not in (None, "quick", "default"):
        raise ManifestError(f'probe.preset {preset!r} must be "quick" or "default"', 'write preset = "quick"')
    settings = raw.get("settings", {})
    if not isinstance(settings, dict):
        raise ManifestError("probe.settings must be a table", "write settings = { field = value }")
    argv = tuple(str_list(raw.get("argv", []), "probe.argv"))
    if kind == "command" and not argv:
        raise ManifestError(
            'probe.kind = "command" needs probe.argv', 'write argv = ["python", "eval.py", "{base_url}"]'
        )
    in_process = target is not None and target.in_process
    if kind == "command" and in_process:
        raise ManifestError('probe.kind = "command" needs a server target (target.launch)', "use divergence or recall")
    if kind != "command" and argv:
        raise ManifestError('probe.argv is only for kind = "command"', "drop probe.argv")
    timeout = number(raw.get("timeout", 600.0), "probe.timeout")
    reference = raw.get("reference", "recorded")
    if not isinstance(reference, str) or not reference:
        raise ManifestError("probe.reference must be a string", 'write reference = "recorded", "live" or a file path')
    if reference not in REFERENCE_MODES:
        if kind != "divergence":
            raise ManifestError(
                f'probe.reference = {reference!r} (a recording) is for kind = "divergence"',
                "drop probe.reference: recall's reference is the baseline trial",
            )
        reference = str(resolve(base, reference))
    api, model = raw.get("api", "openai"), raw.get("model")
    if api not in PROBE_APIS:
        raise ManifestError(f"probe.api {api!r} is not one of {', '.join(PROBE_APIS)}", 'write api = "openai"')
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ManifestError("probe.model must be a non-empty string", 'write model = "the name the server serves"')
    for key in ("api", "model"):
        if key in raw and (in_process or kind == "command"):
            raise ManifestError(f"probe.{key} is for the HTTP probes of a server target", f"drop probe.{key}")
    try:  # the spec's Probe (a union tagged on kind) is the last word on types and keys
        parse_probe(dict(raw))
    except UsageError as exc:
        raise ManifestError(exc.problem, exc.fix) from None
    preset_name = None if preset == "default" else preset
    return ProbeSpec(kind, preset_name, dict(settings), argv, timeout, api, model, reference)


def _verdict(raw: Mapping[str, Any], probe: ProbeSpec) -> tuple[VerdictSpec | None, tuple[str, str] | None]:
    """The verdict, or None with the problem (no bound, and no recorded floor to derive one from): the stage
    that needs a verdict raises it; a gate that brings its own rule does not."""
    no_unknown(raw, _VERDICT_KEYS, "verdict.", "verdict")
    rule = raw.get("rule", "recall_drop" if probe.kind == "recall" else "threshold")
    if rule not in RULES:
        raise ManifestError(f"verdict.rule {rule!r} is not one of {', '.join(RULES)}", 'write rule = "threshold"')
    if rule == "recall_drop" and probe.kind != "recall":
        raise ManifestError('verdict.rule = "recall_drop" needs probe.kind = "recall"', "change one of them")
    default_metric = {"divergence": DEFAULT_BOUND.metric, "recall": "accuracy", "command": "metric"}[probe.kind]
    metric = raw.get("metric", default_metric)
    if not isinstance(metric, str) or not metric:
        raise ManifestError("verdict.metric must be a figure name", f'write metric = "{default_metric}"')
    direction = raw.get("direction", polarity(metric, "above"))  # the registry's; a command's own figure: above
    if direction not in DIRECTIONS:
        raise ManifestError(f"verdict.direction {direction!r} must be above or below", 'write direction = "above"')
    near = number(raw.get("near", 0.25), "verdict.near", allow_zero=True)
    if near >= 1:
        raise ManifestError("verdict.near must be below 1 (a relative band around the bound)", "write near = 0.25")
    rates = _error_rates(raw)
    if rule == "threshold" and "bound" not in raw:
        verdict, problem = _recorded_floor_verdict(raw, probe, metric, direction, near)
        return (dataclasses.replace(verdict, **rates) if verdict is not None else None), problem
    return (
        VerdictSpec(
            rule=rule,
            metric=metric,
            bound=number(raw.get("bound", 0.0), "verdict.bound", allow_zero=True, allow_negative=True),
            direction=direction,
            near=near,
            repeats=integer(raw.get("repeats", 2), "verdict.repeats", minimum=0),
            margin=number(raw.get("margin", 0.0), "verdict.margin", allow_zero=True),
            **rates,
        ),
        None,
    )


def _error_rates(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``alpha``, ``beta`` (each in (0, 0.5)) and ``sequential`` (a boolean) of ``[verdict]``."""
    out: dict[str, Any] = {}
    for key, default in (("alpha", 0.05), ("beta", 0.2)):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 0.5:
            raise ManifestError(
                f"verdict.{key} must be a number in (0, 0.5), not {value!r}", f"write {key} = {default}"
            )
        out[key] = float(value)
    sequential = raw.get("sequential", True)
    if not isinstance(sequential, bool):
        raise ManifestError(f"verdict.sequential must be true or false, not {sequential!r}", "write sequential = true")
    out["sequential"] = sequential
    return out


def _recorded_floor_verdict(
    raw: Mapping[str, Any], probe: ProbeSpec, metric: str, direction: str, near: float
) -> tuple[VerdictSpec | None, tuple[str, str] | None]:
    """No ``verdict.bound``: derived from the noise floor stored in the reference recording, if any."""
    from speedtrap.probe import DEFAULT_MARGIN, read_recording

    floor = read_recording(Path(probe.reference)).floor if probe.reference not in REFERENCE_MODES else None
    if floor is None:
        return None, (
            "verdict.bound is missing",
            "write bound = <the value a passing configuration stays within>, or point probe.reference at a "
            "recording that holds a noise floor (speedtrap record --floor)",
        )
    if direction != "above":
        raise ManifestError("a noise floor bounds a figure that fails above", 'write direction = "above" or a bound')
    try:
        derived = Bound.from_floor(floor, metric, DEFAULT_MARGIN)
    except UsageError as exc:
        raise ManifestError(exc.problem, exc.fix) from None
    return VerdictSpec(
        rule="threshold", metric=metric, bound=derived.value, direction=direction, near=near,
        repeats=integer(raw.get("repeats", 2), "verdict.repeats", minimum=0),
        margin=number(raw.get("margin", 0.0), "verdict.margin", allow_zero=True),
        origin=f"{derived.origin}, stored with {Path(probe.reference).name}",
    ), None  # fmt: skip
