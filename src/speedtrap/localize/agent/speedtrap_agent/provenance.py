"""Where a factor is applied: every site that uses its value while an MoE unit is replayed, and what each adds.

The scale check replays a unit with every copy of the factor set to each of a few values ``v``. While
it runs, two recorders watch the unit's forward (and nothing else: they are armed around the unit's
call only, on its own thread):

- a ``torch.overrides.TorchFunctionMode`` sees every tensor operation and custom op (``torch.ops``)
  the unit calls; an operation with an operand equal to ``v`` (a Python number, a 0-dim or
  one-element tensor, a broadcast constant: every stride 0) is a site, at the innermost frame
  outside torch, the standard library and this package (``topk.py:1451``, ``biased_grouped_topk_impl``).
  A custom op that receives ``v`` as a plain number is a *kernel argument*; any other op a *tensor operand*.
- ``sys.setprofile`` (this thread, the unit's forward only) sees every Python call; a call from the
  model's code into a library outside torch (a Triton launcher: ``kernel[grid](..., routed_scaling_factor)``)
  with ``v`` among its arguments is a *kernel argument* at the calling line. A call from the model's
  code into the model's code with ``v`` among its arguments is a *call argument*: usually it only
  passes the factor on, and when a site is recorded inside it, it is marked so and not counted.
  (torch's own Python functions are left to the function mode, which sees them with their arguments.)

A site is a *candidate* when it was recorded in every replay with that replay's value (its operand
follows the factor): a constant that happens to equal one value does not. Each candidate is then
measured alone: the unit is replayed at the nominal value with that one site's operand doubled
(the function mode replaces the argument; a Python call's argument is replaced in its frame at the
call), and the exponent attributable to the site is ``log2(||o'|| / ||o||)``, with the shape residual
``||o' - 2^k o|| / ||o'||`` saying whether ``o'`` is ``o`` scaled. A site that reads the factor
without applying it (a comparison, a kernel that ignores the argument) gets exponent 0 and is not
counted; a site counted applies the factor ``round(k)`` times.

What it cannot see: the factor transformed before use (``x * (1 / f)``, ``f ** 2``), a value baked
into a tensor before the replay (a buffer made at load time does not follow the varied attribute),
and arithmetic inside a compiled kernel that reads the factor from memory rather than as an argument.
A creation of a 0-dim tensor from the factor and the multiply by it are both sites (each, doubled
alone, doubles the output): the unit's exponent beside the sites' sum says when sites chain.

Self-contained (the standard library and torch only): it runs inside the engine's worker too.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

SiteKey = tuple[str, int, str]  # file, line, op (the torch function or the callee)
MAX_CANDIDATES = 8  # sites measured alone per unit (each is one more replay)
REL_TOL = 1e-6
EXPONENT_TOLERANCE = 0.05
SHAPE_TOLERANCE = 1e-3
MAX_DEPTH = 200  # frames walked up from an event (to mark the calls it is inside)


def _equal(obj: Any, value: float) -> bool:
    """``obj`` holds ``value``: a number, a one-element tensor, or a broadcast constant (every stride 0)."""
    if isinstance(obj, bool):
        return False
    if isinstance(obj, (int, float)):
        return math.isclose(float(obj), value, rel_tol=REL_TOL)
    import torch

    if isinstance(obj, torch.Tensor) and (obj.is_floating_point() or not obj.dtype.is_complex):
        if obj.dtype == torch.bool or obj.numel() == 0:
            return False
        if obj.numel() == 1 or all(s == 0 for s in obj.stride()):
            try:
                return math.isclose(float(obj.reshape(-1)[0].item()), value, rel_tol=REL_TOL)
            except (RuntimeError, ValueError):  # a meta tensor, a graph being captured
                return False
    return False


def _replace(obj: Any, value: float, new: float) -> Any:
    """``obj`` with ``new`` in place of ``value`` (the same type: a number, or a tensor like it)."""
    if isinstance(obj, (int, float)) and not isinstance(obj, bool):
        return new
    import torch

    if isinstance(obj, torch.Tensor):
        return torch.full_like(obj, new) if obj.numel() == 1 else obj.new_full((), new).expand(obj.shape)
    return obj


class _Roots:
    """Which files are libraries: torch, the standard library, this package, Triton (when loaded)."""

    def __init__(self) -> None:
        import torch

        roots = [os.path.dirname(torch.__file__), os.path.dirname(os.path.abspath(__file__))]
        self.torch = roots[0] + os.sep
        self.stdlib = os.path.dirname(os.__file__) + os.sep
        for name in ("triton",):
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__file__", None):
                roots.append(os.path.dirname(str(module.__file__)))
        self.roots = tuple(r + os.sep for r in roots)
        self.cache: dict[str, bool] = {}

    def library(self, filename: str) -> bool:
        known = self.cache.get(filename)
        if known is None:
            std = filename.startswith(self.stdlib) and "-packages" not in filename
            known = self.cache[filename] = filename.startswith("<") or std or filename.startswith(self.roots)
        return known

    def in_torch(self, filename: str) -> bool:
        return filename.startswith(self.torch)


class Site:
    """One place that used the factor's value: where, how, and what it saw in each replay."""

    def __init__(self, key: SiteKey, function: str, kind: str) -> None:
        self.key = key
        self.function = function
        self.kind = kind
        self.replays: set[int] = set()
        self.calls = 0
        self.passes_on = False  # a call argument with another site recorded inside the call
        self.exponent: float | None = None
        self.shape_residual: float | None = None

    @property
    def applies(self) -> int:
        """How many times the site applies the factor (0: it reads it without applying it)."""
        k, r = self.exponent, self.shape_residual
        if k is None or r is None or r > SHAPE_TOLERANCE or abs(k - round(k)) > EXPONENT_TOLERANCE:
            return 0
        return round(k)

    def to_json(self) -> dict[str, Any]:
        file, line, op = self.key
        return {"file": file, "line": line, "function": self.function, "kind": self.kind, "op": op,
                "calls": self.calls, "exponent": self.exponent, "shape_residual": self.shape_residual,
                "applies": self.applies, "passes_on": self.passes_on}  # fmt: skip


class Provenance:
    """The sites of one unit over its replays (``recording``), then each candidate measured alone."""

    def __init__(self, values: list[float], nominal: float) -> None:
        self.values = values
        self.nominal = nominal
        self.sites: dict[SiteKey, Site] = {}
        self.roots = _Roots()
        self.seconds = 0.0
        self.replays = 0
        self._replay = -1
        self._value = 0.0
        self._target: SiteKey | None = None  # the site whose operand is doubled
        self._open: dict[int, Site] = {}  # frames of recorded calls still running
        self._names: dict[Any, tuple[str, ...]] = {}  # argument names by code object

    # -- recording --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def recording(self, index: int) -> Iterator[None]:
        """Record the sites of one replay at ``values[index]``."""
        with self._armed(index, self.values[index], None):
            yield

    @contextlib.contextmanager
    def doubled(self, key: SiteKey, value: float) -> Iterator[None]:
        """Replay with ``key``'s operand ``value`` doubled (and nothing recorded)."""
        with self._armed(-1, value, key):
            yield

    @contextlib.contextmanager
    def _armed(self, index: int, value: float, target: SiteKey | None) -> Iterator[None]:
        started = time.perf_counter()
        self._replay, self._value, self._target, self._open = index, value, target, {}
        previous = sys.getprofile()
        mode = _mode(self)
        try:
            with mode:
                sys.setprofile(self._profile)
                try:
                    yield
                finally:
                    sys.setprofile(previous)
        finally:
            self._open = {}
            self.seconds += time.perf_counter() - started

    def _where(self, frame: Any) -> tuple[Any, list[int]]:
        """The innermost frame outside the libraries, and the ids of the frames above it (open calls)."""
        found, ids = None, []
        depth = 0
        while frame is not None and depth < MAX_DEPTH:
            ids.append(id(frame))
            if found is None and not self.roots.library(frame.f_code.co_filename):
                found = frame
            frame = frame.f_back
            depth += 1
        return found, ids

    def _hit(self, key: SiteKey, function: str, kind: str, ids: list[int]) -> None:
        for ident in ids:
            outer = self._open.get(ident)
            if outer is not None and outer.key != key:
                outer.passes_on = True
        if self._replay < 0:
            return
        site = self.sites.get(key)
        if site is None:
            site = self.sites[key] = Site(key, function, kind)
        site.replays.add(self._replay)
        site.calls += self._replay == 0

    def on_op(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """A torch operation: a site when an operand holds the value; doubled when it is the target."""
        value = self._value
        hits = [i for i, a in enumerate(args) if _equal(a, value)]
        named = [k for k, a in kwargs.items() if _equal(a, value)]
        if not hits and not named:
            return args, kwargs
        frame, ids = self._where(sys._getframe(1))
        if frame is None:
            return args, kwargs
        op = _op_name(func)
        key = (frame.f_code.co_filename, frame.f_lineno, op)
        import torch

        plain = any(not isinstance(a, torch.Tensor) for a in [*(args[i] for i in hits), *(kwargs[k] for k in named)])
        kind = "kernel argument" if plain and _custom(func) else "tensor operand"
        self._hit(key, _qualname(frame.f_code), kind, ids)
        if self._target == key:
            new = value * 2.0
            args = tuple(_replace(a, value, new) if i in hits else a for i, a in enumerate(args))
            kwargs = {k: (_replace(a, value, new) if k in named else a) for k, a in kwargs.items()}
        return args, kwargs

    def _profile(self, frame: Any, event: str, _arg: Any) -> None:
        if event == "return":
            if self._open:
                self._open.pop(id(frame), None)
            return
        if event != "call":
            return
        code = frame.f_code
        caller = frame.f_back
        if caller is None or self.roots.in_torch(code.co_filename) or self.roots.library(caller.f_code.co_filename):
            return
        names = self._names.get(code)
        if names is None:
            names = self._names[code] = _argument_names(code)
        if not names:
            return
        local = frame.f_locals
        value = self._value
        hits = [n for n in names if n in local and _number_equal(local[n], value)]
        if not hits:
            return
        library = self.roots.library(code.co_filename)
        key = (caller.f_code.co_filename, caller.f_lineno, _qualname(code))
        _, ids = self._where(caller)
        self._hit(key, _qualname(caller.f_code), "kernel argument" if library else "call argument", ids)
        site = self.sites.get(key)
        if not library and site is not None:
            self._open[id(frame)] = site
        if self._target == key:
            for n in hits:
                local[n] = value * 2.0
            ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(frame), ctypes.c_int(0))

    # -- measuring each candidate -------------------------------------------------------------------

    def candidates(self) -> list[Site]:
        """Sites recorded in every replay (their operand followed the value), not merely passing it on."""
        every = set(range(len(self.values)))
        found = [s for s in self.sites.values() if s.replays == every and not s.passes_on]
        return found[:MAX_CANDIDATES]

    def measure(self, run: Callable[[Any], Any], reference: Any, value: float) -> None:
        """Each candidate alone: ``run(context)`` replays the unit at ``value`` (whose output is ``reference``)
        under ``context``."""
        import torch

        base = reference.double().reshape(-1)
        base_norm = float(torch.linalg.vector_norm(base))
        for site in self.candidates():
            out = run(self.doubled(site.key, value)).double().reshape(-1)
            self.replays += 1
            norm = float(torch.linalg.vector_norm(out))
            if base_norm <= 0 or norm <= 0 or not math.isfinite(norm):
                continue
            k = math.log2(norm / base_norm)
            site.exponent = k
            site.shape_residual = float(torch.linalg.vector_norm(out - (2.0**k) * base)) / norm

    def to_json(self) -> list[dict[str, Any]]:
        every = set(range(len(self.values)))
        return [s.to_json() for s in self.sites.values() if s.replays == every]


def _number_equal(obj: Any, value: float) -> bool:
    return isinstance(obj, (int, float)) and not isinstance(obj, bool) and math.isclose(obj, value, rel_tol=REL_TOL)


def _argument_names(code: Any) -> tuple[str, ...]:
    count = code.co_argcount + code.co_kwonlyargcount
    return tuple(n for n in code.co_varnames[:count] if n != "self")


_RESUME = re.compile(r"^(?:torch_dynamo_resume_in_|__resume_in_)(.+)_at_\d+$")  # dynamo's frames after a graph break


def _qualname(code: Any) -> str:
    """The function's qualified name; a frame torch.compile resumes after a graph break
    (``torch_dynamo_resume_in_biased_grouped_topk_impl_at_1840``) by the source function it continues."""
    name = str(getattr(code, "co_qualname", code.co_name))
    while match := _RESUME.match(name.rpartition(".")[2]):
        name = match.group(1)
    return name


def _op_name(func: Any) -> str:
    name = getattr(func, "__name__", None)
    if _custom(func) or not name:
        return str(func)
    owner = getattr(func, "__objclass__", None) or getattr(func, "__self__", None)
    prefix = "Tensor." if owner is not None and getattr(owner, "__name__", "") in ("Tensor", "TensorBase") else ""
    return prefix + str(name)


def _custom(func: Any) -> bool:
    """A ``torch.ops`` operator (a compiled kernel registered with torch)."""
    return type(func).__name__ in ("OpOverload", "OpOverloadPacket")


def _mode(provenance: Provenance) -> Any:
    from torch.overrides import TorchFunctionMode

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            args, kwargs = provenance.on_op(func, tuple(args), dict(kwargs or {}))
            return func(*args, **kwargs)

    return Mode()
