"""User patches: ``module:function`` or ``path/to/file.py:function`` entry points.

The function receives the model (for ``hf:`` targets the transformers model itself) and returns
an undo handle: a :class:`speedtrap.patching.Undo` or any zero-argument callable. It is wrapped
as a patch like the catalogue's, with a :class:`PatchInfo`: switched in-process by name (gate
``in-process``), and the facts the user declares as attributes of the function:
``speedtrap_kind`` (``precision``, ``scaling``, ...; default ``kernel``), ``speedtrap_layers``
(layer indices), ``speedtrap_scope`` (the layers in words), ``speedtrap_phases``
(``("prefill",)``, ``("decode",)``; default both) and ``speedtrap_diff`` (a unified diff, read by
triage). Every module the function swaps in, and every ``forward`` it rebinds, is
guarded: an exception raised there while the model runs becomes a :class:`PatchError` that names
the patch, not a traceback from deep inside the model.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._errors import PatchError, SpeedtrapError, UsageError
from speedtrap.patching import Gate, GateKind, PatchInfo, PatchKind, Phase, Undo

if TYPE_CHECKING:  # torch loads with the model, not with the CLI
    from torch import nn

BOTH = frozenset({Phase.PREFILL, Phase.DECODE})


def is_entry_point(spec: str) -> bool:
    """``pkg.mod:func`` or ``file.py:func`` (a catalogue patch name has no colon)."""
    return ":" in spec


def load_user_patch(spec: str) -> UserPatch:
    """Import the function an entry point names and wrap it as a patch."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr.isidentifier():
        raise UsageError(f"patch entry point {spec!r} is not module:function", "e.g. mypkg.patches:double_scale")
    module = _import(where, spec)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"{where} has no function {attr!r} (patch {spec!r})", f"define def {attr}(model): ... there")
    info = _declared_info(spec, where, fn)
    return UserPatch(info, fn)


def _declared_info(spec: str, where: str, fn: Callable[..., Any]) -> PatchInfo:
    """The patch facts the function declares (attributes ``speedtrap_*``), with defaults."""
    doc = (fn.__doc__ or "").strip().splitlines()
    kind = _enum(PatchKind, getattr(fn, "speedtrap_kind", PatchKind.KERNEL.value), spec, "speedtrap_kind")
    raw_phases = getattr(fn, "speedtrap_phases", None)
    phases = BOTH
    if raw_phases is not None:
        items = [raw_phases] if isinstance(raw_phases, str) else list(raw_phases)
        phases = frozenset(_enum(Phase, p, spec, "speedtrap_phases") for p in items) or BOTH
    try:
        layers = tuple(int(x) for x in getattr(fn, "speedtrap_layers", ()))
    except (TypeError, ValueError):
        raise UsageError(f"patch {spec!r} declares speedtrap_layers that are not integers", "e.g. (0, 1, 2)") from None
    scope = str(getattr(fn, "speedtrap_scope", "") or _scope_words(layers))
    return PatchInfo(
        name=spec,
        summary=doc[0] if doc else f"user patch {spec}",
        gate=Gate(GateKind.IN_PROCESS),
        kind=kind,
        layers=layers,
        scope=scope,
        phases=phases,
        diff=str(getattr(fn, "speedtrap_diff", "") or ""),
        file=where,
    )


def _enum(cls: Any, value: Any, spec: str, attr: str) -> Any:
    try:
        return cls(str(value))
    except ValueError:
        raise UsageError(f"patch {spec!r} declares {attr}={value!r}", f"use one of {[k.value for k in cls]}") from None


def _scope_words(layers: tuple[int, ...]) -> str:
    if not layers:
        return "user patch (layers unknown)"
    if layers == tuple(range(layers[0], layers[-1] + 1)) and len(layers) > 1:
        return f"layers {layers[0]}-{layers[-1]}"
    return "layers " + ", ".join(str(x) for x in layers)


def _import(where: str, spec: str) -> Any:
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        if not path.is_file():
            raise UsageError(f"patch file {where} not found (patch {spec!r})", "give an existing .py file")
        name = "speedtrap_user_patch_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
        if name in sys.modules:
            return sys.modules[name]
        loader_spec = importlib.util.spec_from_file_location(name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise UsageError(f"cannot import {path} (patch {spec!r})", "give a Python source file")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise UsageError(f"importing {path} failed: {type(exc).__name__}: {exc}"[:300], "fix the file") from None
        return module
    try:
        return importlib.import_module(where)
    except Exception as exc:  # ModuleNotFoundError, or the module's own import-time error
        raise UsageError(
            f"cannot import module {where!r} for patch {spec!r}: {type(exc).__name__}: {exc}"[:300],
            "check the module path (it must be importable, e.g. on PYTHONPATH) or give path/to/file.py:function",
        ) from None


@dataclass
class UserPatch:
    info: PatchInfo
    fn: Callable[[nn.Module], Any]

    def apply(self, model: Any) -> Undo:
        root: nn.Module = model.patch_root() if hasattr(model, "patch_root") else model
        before_ids = {id(m) for m in root.modules()}
        before_forward = {id(m): vars(m).get("forward") for m in root.modules()}
        handle = self.fn(root)
        undo = Undo()
        if isinstance(handle, Undo):
            undo.extend(handle)
        elif callable(handle):
            undo.steps.append(handle)
        else:
            raise PatchError(
                f"patch {self.info.name!r} returned {type(handle).__name__}, not an undo handle",
                "return a speedtrap.patching.Undo or a function that undoes the patch",
            )
        for module in root.modules():
            if id(module) not in before_ids or vars(module).get("forward") is not before_forward.get(id(module)):
                undo.steps.append(self._guard(module))
        return undo

    def _guard(self, module: nn.Module) -> Callable[[], None]:
        """Make ``module.forward`` name this patch when it raises; returns how to undo that."""
        had_own = "forward" in vars(module)
        own = vars(module).get("forward")
        original = module.forward
        name = self.info.name

        @functools.wraps(original)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            except SpeedtrapError:
                raise
            except Exception as exc:
                raise PatchError(
                    f"patch {name!r} raised during forward in {type(module).__name__}: {type(exc).__name__}: {exc}"[
                        :400
                    ],
                    "fix the patch function (run it on the model in a Python shell to see the traceback)",
                ) from exc

        module.forward = guarded  # type: ignore[method-assign]

        def restore() -> None:
            if had_own:
                module.forward = own  # type: ignore[method-assign,assignment]
            else:
                vars(module).pop("forward", None)

        return restore
