"""``speedtrap.toml``: the target, its patches, the probe and the verdict rule that isolate reads.

The ``[[patches]]`` tables are the ones triage reads too (name, env, args, config, diff, gate,
summary); isolate adds ``requires`` / ``conflicts`` and the ``[target]``, ``[probe]``,
``[verdict]`` and ``[search]`` tables::

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

    [search]
    prior = ["hash_topk_routed_scaling"]   # likely suspects first (triage's tiers)
    parallel = 1                   # trials at once: servers on threads, or Ray workers
    executor = "local"             # local | ray (pip install 'speedtrap[ray]')
    address = "10.0.0.1:6379"      # executor = "ray": the cluster; left out: a local one for the run
    resources = { num_gpus = 1 }   # executor = "ray": what one trial reserves (num_cpus, num_gpus, custom)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from speedtrap._errors import ManifestError, UsageError
from speedtrap._toml import read_manifest_toml
from speedtrap.isolate._fields import integer, no_unknown, number, resolve, str_list, str_table, table
from speedtrap.isolate._roles import STACK_KEYS, StackSpec, agree_conflict, parse_stack, patch_roles
from speedtrap.isolate._spec import (
    DEFAULT_HEALTH,
    DIRECTIONS,
    EXECUTORS,
    PROBE_APIS,
    PROBE_KINDS,
    REFERENCE_MODES,
    RULES,
    IsolateManifest,
    PatchSpec,
    ProbeSpec,
    TargetSpec,
    VerdictSpec,
)
from speedtrap.isolate._worktree import commit_target_fields, resolve_commit_patches
from speedtrap.spec import DEFAULT_BOUND, Bound, Platform, parse_probe, polarity

__all__ = [
    "IsolateManifest",
    "PatchSpec",
    "ProbeSpec",
    "TargetSpec",
    "VerdictSpec",
    "check_relations",
    "load_isolate_manifest",
    "manifest_stack",
    "parse_manifest",
    "parse_patches",
]

_TARGET_KEYS = {
    "name",
    "overrides",
    "launch",
    "model",
    "health",
    "served_model",
    "start_timeout",
    "stop_timeout",
    "env",
    "config_args",
    "retries",
    "cwd",
    "repo",
    "base",
    "pythonpath",
    "platform",
    *STACK_KEYS,
}
# kind / scope / phases are facts a patch's author may declare for triage; isolate ignores them.
_PATCH_KEYS = {
    "name",
    "env",
    "args",
    "config",
    "diff",
    "gate",
    "summary",
    "requires",
    "conflicts",
    "kind",
    "scope",
    "phases",
    "commit",
    "roles",
    "split",
}
_PROBE_KEYS = {"kind", "preset", "settings", "argv", "timeout", "reference", "api", "model"}
_VERDICT_KEYS = {"rule", "metric", "bound", "direction", "near", "repeats", "margin"}
_SEARCH_KEYS = {"prior", "parallel", "executor", "address", "resources"}


# ----------------------------------------------------------------------------------------------
# Reading and checking.


def load_isolate_manifest(path: Path) -> IsolateManifest:
    """Read and check a manifest; every problem is a :class:`ManifestError` naming the field."""
    path = Path(path)
    data = read_manifest_toml(path)
    return parse_manifest(data, path.parent, path)


def parse_manifest(data: Mapping[str, Any], base: Path, path: Path | None = None) -> IsolateManifest:
    """Check a parsed TOML document; relative paths are taken from ``base``.

    Other top-level tables (another tool's sections, triage's ``tree``) are left alone; inside the
    tables isolate reads, an unknown key is an error (a typo must not silently change a search).
    """
    target = _target(table(data, "target", required=True), base, path)
    patches = parse_patches(data.get("patches"), base, required=not target.in_process, stack=target.stack)
    target, patches = resolve_commit_patches(target, patches)
    probe = _probe(table(data, "probe"), target, base)
    verdict = _verdict(table(data, "verdict"), probe)
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
    return IsolateManifest(
        path, target, patches, probe, verdict, tuple(prior), parallel, executor, address, tuple(resources)
    )


def manifest_stack(data: Mapping[str, Any], path: Path | None) -> StackSpec | None:
    """The stack of roles a parsed manifest declares (``target.roles``), or None: triage reads patches with it."""
    target = data.get("target")
    return parse_stack(target, path) if isinstance(target, dict) and "roles" in target else None


def _target(raw: Mapping[str, Any], base: Path, path: Path | None = None) -> TargetSpec:
    no_unknown(raw, _TARGET_KEYS, "target.", "target")
    platform = Platform.parse(raw["platform"], "target.platform", ManifestError) if "platform" in raw else None
    stack = parse_stack(raw, path)
    if stack is not None:  # the entry role's launch and health stand for the target's
        if "name" in raw:
            raise ManifestError("target has both name and roles", "drop target.name: a stack of roles is launched")
        if "health" in raw:
            raise ManifestError("target.health is per role in a stack", "write health in each [target.roles.NAME]")
        raw = {**raw, "launch": list(stack.entry.launch), "health": stack.entry.health}
        if any("{model}" in a for r in stack.roles for a in r.launch) and raw.get("model") is None:
            raise ManifestError(
                "a role's launch uses {model} but target.model is not set", 'add model = "path/to/model"'
            )
    name, launch = raw.get("name"), raw.get("launch")
    if (name is None) == (launch is None):
        raise ManifestError(
            "target needs exactly one of target.name (an in-process target) or target.launch (a server command)",
            'write name = "smol-moe", or launch = ["python", "-m", "...", "--port", "{port}"]',
        )
    if name is not None:
        if not isinstance(name, str) or not name.strip():
            raise ManifestError("target.name must be a non-empty string", 'write name = "smol-moe"')
        for key in ("model", "health", "served_model", "config_args", "env", "start_timeout", "repo"):
            if key in raw:
                raise ManifestError(f"target.{key} is for servers, not in-process targets", f"drop target.{key}")
        return TargetSpec(
            name=name, overrides=str_table(raw.get("overrides", {}), "target.overrides"), platform=platform
        )
    argv = str_list(launch, "target.launch")
    if not argv:
        raise ManifestError("target.launch is empty", 'write launch = ["program", "arg", ..., "{port}"]')
    if not any("{port}" in a for a in argv):
        raise ManifestError("target.launch has no {port} placeholder", 'add the port argument, e.g. "--port", "{port}"')
    model = raw.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        raise ManifestError("target.model must be a path string", 'write model = "models/x.gguf"')
    if any("{model}" in a for a in argv) and model is None:
        raise ManifestError("target.launch uses {model} but target.model is not set", 'add model = "path/to/model"')
    if model is not None:
        model = str(resolve(base, model))
    health = raw.get("health", DEFAULT_HEALTH)
    if not isinstance(health, str) or not health.startswith(("http://", "https://")):
        raise ManifestError("target.health must be an http:// URL", 'write health = "http://127.0.0.1:{port}/health"')
    served = raw.get("served_model")
    if served is not None and not isinstance(served, str):
        raise ManifestError("target.served_model must be a string", 'write served_model = "my-model"')
    config_args = str_list(raw.get("config_args", ["--set", "{key}={value}"]), "target.config_args")
    cwd = raw.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ManifestError("target.cwd must be a path string", 'write cwd = "."')
    return TargetSpec(
        launch=tuple(argv),
        model=model,
        health=health,
        served_model=served,
        start_timeout=number(raw.get("start_timeout", 120.0), "target.start_timeout"),
        stop_timeout=number(raw.get("stop_timeout", 10.0), "target.stop_timeout"),
        env=str_table(raw.get("env", {}), "target.env"),
        config_args=tuple(config_args),
        retries=integer(raw.get("retries", 1), "target.retries", minimum=0),
        cwd=resolve(base, cwd) if cwd else None,
        stack=stack,
        platform=platform,
        **commit_target_fields(raw, base),
    )


def parse_patches(raw: Any, base: Path, required: bool, stack: StackSpec | None = None) -> tuple[PatchSpec, ...]:
    """The ``[[patches]]`` tables (triage reads them through here too); diff paths relative to ``base``.

    On a stack of roles, ``roles`` names the roles a patch is switched on in (default: every role that runs
    the model), and ``split = true`` makes one switch per role, ``name@role``, for the search.
    """
    if raw is None:
        if required:
            raise ManifestError("manifest has no [[patches]] tables", "add one [[patches]] table per patch")
        return ()
    if not isinstance(raw, list) or not raw:
        raise ManifestError("patches must be [[patches]] tables", "add one [[patches]] table per patch")
    out: list[PatchSpec] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(raw):
        where = f"patches[{i}]"
        if not isinstance(entry, dict):
            raise ManifestError(f"{where} must be a table", "write [[patches]] tables")
        no_unknown(entry, _PATCH_KEYS, f"{where}.", where)
        name = entry.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ManifestError(f"{where}.name is missing or not a string", "give every patch a name")
        if name in seen:
            raise ManifestError(f"{where}.name {name!r} is used twice (also patches[{seen[name]}])", "rename one")
        seen[name] = i
        env = str_table(entry.get("env", {}), f"{where}.env")
        for key, _ in env:
            if not key or "=" in key or "\0" in key:
                raise ManifestError(f"{where}.env: {key!r} is not a valid environment variable name", "rename it")
        args = tuple(str_list(entry.get("args", []), f"{where}.args"))
        config = str_table(entry.get("config", {}), f"{where}.config")
        gate = entry.get("gate")
        if gate not in (None, "ungated"):
            raise ManifestError(f'{where}.gate must be "ungated" when given', 'drop it, or write gate = "ungated"')
        if gate == "ungated" and (env or args or config):
            raise ManifestError(f"{where} is marked ungated but has env/args/config", "drop gate or the switches")
        diff = entry.get("diff")
        if diff is not None and not isinstance(diff, str):
            raise ManifestError(f"{where}.diff must be a path string", 'write diff = "patches/x.diff"')
        summary = entry.get("summary", "")
        if not isinstance(summary, str):
            raise ManifestError(f"{where}.summary must be a string", "quote it")
        commit = entry.get("commit")
        if commit is not None and (not isinstance(commit, str) or not commit.strip()):
            raise ManifestError(f"{where}.commit must be a sha or A..B (a string)", 'write commit = "3f2a9c1"')
        if commit is not None and gate == "ungated":
            raise ManifestError(f"{where} is a commit: it can be switched, so it is not ungated", "drop gate")
        requires = tuple(str_list(entry.get("requires", []), f"{where}.requires"))
        conflicts = tuple(str_list(entry.get("conflicts", []), f"{where}.conflicts"))
        spec = PatchSpec(
            name,
            env,
            args,
            config,
            gate == "ungated",
            resolve(base, diff) if diff else None,
            summary,
            requires,
            conflicts,
            commit.strip() if commit is not None else None,
        )
        out.extend(_role_patches(entry, spec, stack, where))
    check_relations(out)
    return tuple(out)


def _role_patches(entry: Mapping[str, Any], spec: PatchSpec, stack: StackSpec | None, where: str) -> list[PatchSpec]:
    """The patch with its roles checked, or its ``name@role`` halves (``split = true``)."""
    import dataclasses

    written = str_list(entry.get("roles", []), f"{where}.roles")
    split = entry.get("split", False)
    if not isinstance(split, bool):
        raise ManifestError(f"{where}.split must be true or false", "write split = true")
    if "@" in spec.name:
        raise ManifestError(f"{where}.name {spec.name!r} has an @ (kept for split roles: name@role)", "rename it")
    if stack is None:  # triage reading patches alone, or a single-launch target
        if split or written:
            if written and not split:
                return [dataclasses.replace(spec, roles=tuple(written))]
            if split and written:
                return [dataclasses.replace(spec, name=f"{spec.name}@{r}", roles=(r,)) for r in written]
        return [spec]
    roles = patch_roles(stack, spec.name, written, where)
    if spec.ungated and (split or written):
        raise ManifestError(f"{where} is ungated: it cannot be switched per role", "drop roles and split")
    if split and len(roles) < 2:
        raise ManifestError(f"{where}.split needs two roles or more (it has {list(roles)})", "drop split")
    parts = [(f"{spec.name}@{r}", (r,)) for r in roles] if split else [(spec.name, roles if written else ())]
    out = []
    for name, on in parts:
        why = agree_conflict(stack, name, on or stack.model_roles, dict(spec.env), spec.args)
        if why is not None:
            raise ManifestError(f"{where}: {why}", "switch it on every model role: drop roles / split")
        out.append(dataclasses.replace(spec, name=name, roles=on))
    return out


def check_relations(patches: Sequence[PatchSpec]) -> None:
    """``requires`` / ``conflicts`` name known patches, are not self-referential, and requires has no cycle."""
    index = {p.name: i for i, p in enumerate(patches)}
    for i, p in enumerate(patches):
        for field_name in ("requires", "conflicts"):
            for j, other in enumerate(getattr(p, field_name)):
                where = f"patches[{i}].{field_name}[{j}]"
                if other not in index:
                    raise ManifestError(f"{where} names no patch: {other!r}", f"choose from: {', '.join(index)}")
                if other == p.name:
                    raise ManifestError(f"{where}: patch {p.name!r} names itself", "drop it")
        clash = set(p.requires) & set(p.conflicts)
        if clash:
            raise ManifestError(f"patches[{i}] both requires and conflicts with {sorted(clash)}", "keep one")
        if p.ungated and p.conflicts:
            raise ManifestError(
                f"patches[{i}] is ungated (always on) but conflicts with {list(p.conflicts)}",
                "drop the conflict, or give the patch a switch",
            )
    by_name = {p.name: p for p in patches}
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = [*trail[trail.index(name) :], name]
            raise ManifestError(
                f"patches[{index[name]}].requires forms a cycle: {' -> '.join(cycle)}", "break the cycle"
            )
        state[name] = 1
        for req in by_name[name].requires:
            visit(req, [*trail, name])
        state[name] = 2

    for p in patches:
        visit(p.name, [])


def _probe(raw: Mapping[str, Any], target: TargetSpec, base: Path) -> ProbeSpec:
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
    if kind == "command" and target.in_process:
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
        if key in raw and (target.in_process or kind == "command"):
            raise ManifestError(f"probe.{key} is for the HTTP probes of a server target", f"drop probe.{key}")
    try:  # the spec's Probe (a union tagged on kind) is the last word on types and keys
        parse_probe(dict(raw))
    except UsageError as exc:
        raise ManifestError(exc.problem, exc.fix) from None
    preset_name = None if preset == "default" else preset
    return ProbeSpec(kind, preset_name, dict(settings), argv, timeout, api, model, reference)


def _verdict(raw: Mapping[str, Any], probe: ProbeSpec) -> VerdictSpec:
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
    if rule == "threshold" and "bound" not in raw:
        return _recorded_floor_verdict(raw, probe, metric, direction, near)
    return VerdictSpec(
        rule=rule,
        metric=metric,
        bound=number(raw.get("bound", 0.0), "verdict.bound", allow_zero=True, allow_negative=True),
        direction=direction,
        near=near,
        repeats=integer(raw.get("repeats", 2), "verdict.repeats", minimum=0),
        margin=number(raw.get("margin", 0.0), "verdict.margin", allow_zero=True),
    )


def _recorded_floor_verdict(
    raw: Mapping[str, Any], probe: ProbeSpec, metric: str, direction: str, near: float
) -> VerdictSpec:
    """No ``verdict.bound``: derived from the noise floor stored in the reference recording, if any."""
    from speedtrap.probe import DEFAULT_MARGIN, read_recording

    floor = read_recording(Path(probe.reference)).floor if probe.reference not in REFERENCE_MODES else None
    if floor is None:
        raise ManifestError(
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
    )  # fmt: skip
