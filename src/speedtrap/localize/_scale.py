"""Scale check: how many times a config scalar is applied, measured as an exponent.

The honest measurement holds the weights fixed and re-parametrizes: every module attribute named
like the scalar (``MoE.routed_scaling_factor``, a router's ``routed_scaling_factor``) that holds
the config's value is set to ``s`` for a few values of ``s``, and the output of each module that
depends on it is measured on the same inputs. Rebuilding the model instead would also change the
weights' compensation (smol-moe divides its routed experts by the factor), hiding the exponent.

A unit is the MoE block around a consumer (the nearest module with an ``experts`` child); its
routed contribution is its output minus its shared experts' output. Its inputs are captured once
from a forward at the nominal value and replayed, so earlier layers' changes do not leak in. The
exponent is the slope of log ||routed(s)|| against log s (least squares; the residual is reported),
and the shape check asks that routed(s) = (s/s0)^k routed(s0) element by element: a factor that
enters a nonlinearity (routing, activation) is "not a power law", whatever the norms say.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from speedtrap._errors import UsageError
from speedtrap.localize._pairing import float_tensors
from speedtrap.localize._results import (
    ConsumerFit,
    FactorSite,
    PinnedSite,
    ScaleCheckResult,
    ScaleUnit,
    layer_of,
)
from speedtrap.localize.agent.speedtrap_agent import Provenance, assigned, shared_children, unit_of
from speedtrap.targets import InProcessModel

DEFAULT_PARAM = "routed_scaling_factor"
DEFAULT_MULTIPLIERS = (0.5, 1.0, 2.0, 4.0)
FIT_TOLERANCE = 1e-3  # log-space RMS residual and relative shape residual of a power law
INTEGER_TOLERANCE = 0.05

Sites = list[tuple[str, nn.Module]]


def check_scale(
    model: InProcessModel,
    ids: Sequence[int],
    param: str = DEFAULT_PARAM,
    *,
    patches: Sequence[str] = (),
    values: Sequence[float] | None = None,
) -> ScaleCheckResult:
    """Per module that consumes ``param``: the exponent of its routed output in the scalar."""
    ids = [int(t) for t in ids]
    if not ids:
        raise UsageError("scale check needs at least 1 token", "pass a longer input (--tokens N)")
    with model.patched(patches):
        root = model.model
        nominal = _nominal(model, root, param)
        sites, pinned = _sites(root, param, nominal)
        if not sites:
            raise UsageError(
                f"no module of {model.name} holds {param!r} at its config value {nominal:g}",
                "check the name, or whether a patch pinned every copy (see --patches)",
            )
        chosen = _values(values, nominal)
        modules = dict(root.named_modules())
        units = _units(root, sites + [(p.module, modules[p.module]) for p in pinned])
        varied = {id(m) for _, m in sites}
        inputs = _capture(root, [module for module, _ in units.values()], ids)
        configs = _configs(root, param, nominal)
        results: list[ScaleUnit] = []
        seconds = 0.0
        for name, (unit, consumers) in units.items():
            call = inputs.get(id(unit))
            if call is None:
                continue  # never ran on this input (e.g. an unused layer)
            all_sites = [m for _, m in sites]
            provenance = Provenance(chosen, nominal)
            outputs = [
                _routed(unit, call, all_sites, configs, param, s, provenance.recording(i)) for i, s in enumerate(chosen)
            ]
            ref = _reference(chosen, nominal)
            provenance.measure(
                functools.partial(_routed, unit, call, all_sites, configs, param, chosen[ref]),
                outputs[ref],
                chosen[ref],
            )
            seconds += provenance.seconds
            consumers = [(n, m) for n, m in consumers if id(m) in varied]  # pinned ones do not vary
            fits = []
            if not consumers:
                pass  # only pinned copies here: the scalar does not reach this unit
            elif len(consumers) > 1:
                for consumer_name, consumer in consumers:
                    partial = [_routed(unit, call, [consumer], [], param, s) for s in chosen]
                    exponent, residual = _fit(chosen, norms_of(gram_of(partial)))
                    fits.append(ConsumerFit(consumer_name, exponent, residual))
            else:
                exponent, residual = _fit(chosen, norms_of(gram_of(outputs)))
                fits.append(ConsumerFit(consumers[0][0], exponent, residual))
            measured = "output - " + "/".join(shared_children(unit)) if shared_children(unit) else "output"
            factor_sites = tuple(FactorSite.from_json(x) for x in provenance.to_json())
            results.append(unit_from_gram(name, measured, tuple(fits), chosen, gram_of(outputs), nominal, factor_sites))
    return ScaleCheckResult(
        model.name, param, nominal, tuple(chosen), tuple(patches), len(ids), tuple(results), tuple(pinned),
        provenance_cost(seconds, results),
    )  # fmt: skip


def provenance_cost(seconds: float, units: Sequence[ScaleUnit]) -> dict[str, float]:
    """What recording the sites cost: seconds under the recorders (the replays recorded, which run anyway, and
    one more replay per candidate site) and the bytes of the sites' JSON."""
    size = sum(len(json.dumps([x.to_json() for x in u.sites or ()])) for u in units)
    return {"seconds": round(seconds, 4), "bytes": size}


def _nominal(model: InProcessModel, root: nn.Module, param: str) -> float:
    for source in (model.config, getattr(root, "config", None)):
        value = source.get(param) if isinstance(source, dict) else getattr(source, param, None)
        if isinstance(value, (int, float)) and _is_number(value):
            return float(value)
    values = [getattr(m, param) for _, m in root.named_modules() if _is_number(getattr(m, param, None))]
    if values:
        return float(max(set(values), key=values.count))
    scalars = sorted(k for k, v in model.config.items() if _is_number(v) and not isinstance(v, int))
    raise UsageError(
        f"{model.name} has no parameter {param!r}",
        f"choose a float config scalar: {', '.join(scalars[:12]) or '(none found)'}",
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _sites(root: nn.Module, param: str, nominal: float) -> tuple[Sites, list[PinnedSite]]:
    """Modules holding ``param`` at the config's value (they read it) and those pinned elsewhere."""
    sites: Sites = []
    pinned: list[PinnedSite] = []
    for name, module in root.named_modules():
        value = vars(module).get(param)
        if not isinstance(value, (int, float)) or not _is_number(value):
            continue
        if math.isclose(float(value), nominal, rel_tol=1e-9):
            sites.append((name, module))
        else:
            pinned.append(PinnedSite(name, float(value)))
    return sites, pinned


def _configs(root: nn.Module, param: str, nominal: float) -> list[Any]:
    """Mutable config objects holding the scalar (modules that read it at forward time see it too)."""
    seen: dict[int, Any] = {}
    for module in root.modules():
        config = getattr(module, "config", None)
        value = getattr(config, param, None) if config is not None and not isinstance(config, dict) else None
        if isinstance(value, (int, float)) and _is_number(value) and math.isclose(value, nominal, rel_tol=1e-9):
            seen[id(config)] = config
    return [c for c in seen.values() if _settable(c, param)]


def _settable(obj: Any, param: str) -> bool:
    try:
        setattr(obj, param, getattr(obj, param))
    except Exception:  # frozen dataclasses and validating configs refuse
        return False
    return True


def _values(values: Sequence[float] | None, nominal: float) -> list[float]:
    chosen = [float(v) for v in values] if values else [nominal * m if nominal > 0 else m for m in DEFAULT_MULTIPLIERS]
    if len(set(chosen)) < 2 or any(not v > 0 or not math.isfinite(v) for v in chosen):
        raise UsageError(f"scale values {chosen} must be at least 2 distinct positive numbers", "e.g. --values 1,2,4")
    return chosen


def _units(root: nn.Module, sites: Sites) -> dict[str, tuple[nn.Module, Sites]]:
    """Group consumers by the MoE block around them (nearest module with an ``experts`` child)."""
    modules = dict(root.named_modules())
    children = {n: {c for c, _ in m.named_children()} for n, m in modules.items()}
    units: dict[str, tuple[nn.Module, Sites]] = {}
    for name, module in sites:
        unit_name = unit_of(name, children)
        unit_name = name if unit_name is None else unit_name
        units.setdefault(unit_name, (modules[unit_name], []))[1].append((name, module))
    return dict(sorted(units.items(), key=lambda kv: list(modules).index(kv[0])))


Call = tuple[tuple[Any, ...], dict[str, Any]]


@torch.inference_mode()
def _capture(root: nn.Module, units: list[nn.Module], ids: list[int]) -> dict[int, Call]:
    """Each unit's inputs in one forward at the nominal value (the first call of each)."""
    captured: dict[int, Call] = {}

    def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        captured.setdefault(id(module), (args, dict(kwargs)))

    handles = [u.register_forward_pre_hook(hook, with_kwargs=True) for u in units]
    try:
        root(torch.tensor([ids], dtype=torch.long))
    finally:
        for h in handles:
            h.remove()
    return captured


@torch.inference_mode()
def _routed(
    unit: nn.Module,
    call: Call,
    sites: list[nn.Module],
    configs: list[Any],
    param: str,
    value: float,
    context: contextlib.AbstractContextManager[Any] | None = None,
) -> Tensor:
    """The unit's output minus its shared experts' output, with the scalar set to ``value``."""
    shared: list[Tensor] = []
    handles = [
        getattr(unit, n).register_forward_hook(lambda _m, _a, out: shared.extend(float_tensors(out)[:1]))
        for n in shared_children(unit)
    ]
    try:
        with assigned([*sites, *configs], param, value), context or contextlib.nullcontext():
            out = float_tensors(unit(*call[0], **call[1]))
    finally:
        for h in handles:
            h.remove()
    if not out:
        raise UsageError(f"module {type(unit).__name__} returns no tensor", "check the scale of another module")
    routed = out[0].double()
    for s in shared:
        routed = routed - s.double().reshape(routed.shape)
    return routed


def _fit(values: Sequence[float], norms: Sequence[float]) -> tuple[float | None, float | None]:
    """Least-squares slope of log(norm) on log(value), and the RMS residual in log space."""
    if any(n <= 0 or not math.isfinite(n) for n in norms):
        return None, None
    xs = [math.log(v) for v in values]
    ys = [math.log(n) for n in norms]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    residual = math.sqrt(sum((y - (my + slope * (x - mx))) ** 2 for x, y in zip(xs, ys, strict=True)) / len(xs))
    return slope, residual


def gram_of(outputs: Sequence[Tensor]) -> list[list[float]]:
    """Inner products of the routed outputs (float64): all that the verdict needs of them."""
    stacked = torch.stack([o.double().reshape(-1) for o in outputs])
    return cast(list[list[float]], (stacked @ stacked.T).tolist())


def norms_of(gram: Sequence[Sequence[float]]) -> list[float]:
    return [math.sqrt(max(float(gram[i][i]), 0.0)) for i in range(len(gram))]


def unit_from_gram(
    name: str,
    measured: str,
    fits: tuple[ConsumerFit, ...],
    values: Sequence[float],
    gram: Sequence[Sequence[float]],
    nominal: float,
    sites: tuple[FactorSite, ...] | None = None,
) -> ScaleUnit:
    """The verdict of one unit from the Gram matrix of its routed outputs at ``values`` (in-process and live).

    The shape residual ``max_i ||o_i - (v_i/v_ref)^k o_ref|| / ||o_i||`` is exact from inner products:
    ``||o_i - c o_r||^2 = G_ii - 2c G_ir + c^2 G_rr``.
    """
    norms = tuple(norms_of(gram))
    exponent, residual = _fit(values, norms)
    if exponent is None or residual is None:
        verdict = "no routed output to measure" if all(n == 0 for n in norms) else "not a power law (zero output)"
        return ScaleUnit(name, layer_of(name), measured, fits, norms, None, None, None, None, verdict, sites)
    ref = _reference(values, nominal)
    shape = 0.0
    for i, v in enumerate(values):
        c = (v / values[ref]) ** exponent
        sq = float(gram[i][i]) - 2 * c * float(gram[i][ref]) + c * c * float(gram[ref][ref])
        shape = max(shape, math.sqrt(max(sq, 0.0)) / max(norms[i], 1e-300))
    times: int | None = None
    if residual > FIT_TOLERANCE or shape > FIT_TOLERANCE:
        verdict = "not a power law"
    elif abs(exponent - round(exponent)) > INTEGER_TOLERANCE:
        verdict = f"power law with a non-integer exponent {exponent:.3g}"
    else:
        times = round(exponent)
        verdict = _words(times)
    return ScaleUnit(name, layer_of(name), measured, fits, norms, exponent, residual, shape, times, verdict, sites)


def _reference(values: Sequence[float], nominal: float) -> int:
    """The index of the value nearest the nominal one (the output the others are compared with)."""
    return min(range(len(values)), key=lambda i: abs(values[i] - nominal))


def _words(times: int) -> str:
    if times == 0:
        return "never applied (exponent 0)"
    if times < 0:
        return f"divided out {-times} time{'s' if times < -1 else ''} (exponent {times})"
    return {1: "applied once", 2: "applied twice"}.get(times, f"applied {times} times")
