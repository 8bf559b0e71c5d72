"""Two forwards in lock-step: the baseline model tree in a greenlet, the patched one in the caller.

Design (memory is the point): the baseline and the patched configuration run on two module trees
that share every parameter and buffer (the baseline tree is a structural copy made before the
patches are applied). Forward hooks make the two runs alternate module by module: the baseline
computes a module, hands its output over and waits; the patched run computes the same module,
compares on the fly and releases the baseline. The two runs are greenlets of one OS thread: they
alternate by explicit switches (no locks, no second OpenMP team spinning on the two cores), and
each module runs with all the intra-op threads. No activation outlives its comparison, so the
peak is about two forwards' live activations, not a stored trace. A module whose output is much
larger than its input (the lm_head: 85x on smol-moe) is not handed over at all: the baseline keeps
its input and the patched side recomputes the baseline output in position chunks, so the two
full logit matrices never coexist (the baseline copy's linear head is stubbed, see ``_heads.py``,
so that GEMM still runs once per side).

Modules are matched by canonical name (``X.inner`` counts as ``X``: a patch that wraps ``X``
keeps the original as ``X.inner``) and by token position, so a patched run that prefills in chunks
is compared slice by slice against the one-shot baseline.
"""

from __future__ import annotations

import weakref
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import greenlet
import torch
from torch import Tensor, nn

RECOMPUTE_RATIO = 8  # output elements per input element above which the baseline recomputes
RECOMPUTE_CHUNK_ELEMENTS = 1 << 20
DEFERRED_BUDGET_BYTES = 256 << 20  # baseline outputs kept for out-of-order matches, at most


class Aborted(Exception):
    """Thrown into the baseline greenlet to unwind it when the patched run failed."""


class CompareError(RuntimeError):
    """speedtrap's own comparison failed inside a hook (a bug here, not in a patch)."""


def canonical(name: str) -> str:
    """``layers.0.attn_hc.proj.inner`` -> ``layers.0.attn_hc.proj``."""
    return ".".join(part for part in name.split(".") if part != "inner")


def float_tensors(obj: Any) -> list[Tensor]:
    """The floating-point tensors in a module output (tuples, lists, dicts, ModelOutputs)."""
    if isinstance(obj, Tensor):
        return [obj] if obj.is_floating_point() else []
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in float_tensors(v)]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in float_tensors(v)]
    return []


def position_dim(t: Tensor, tokens: int) -> int | None:
    """The first dimension whose size is the call's token count (positions precede features)."""
    for dim, size in enumerate(t.shape):
        if size == tokens:
            return dim
    return None


@dataclass
class Recompute:
    """How to recompute a baseline output from its inputs (``forward`` is the module's real one)."""

    forward: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    first_row: Tensor | None  # kept rows to check that it is position-wise (None: a linear head)
    last_row: Tensor | None


@dataclass
class Entry:
    """One baseline module output waiting for its patched counterpart."""

    seq: int
    name: str
    tensors: list[Tensor]
    pos_dims: list[int | None]
    offset: int
    tokens: int
    x_sq: list[Tensor | None]
    alias_of: str | None = None
    recompute: Recompute | None = None
    covered: int = 0  # positions compared so far
    done: bool = False
    released: bool = False

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)


@dataclass
class SideState:
    """Per forward call: where this side is (token offset of the current step, live outputs)."""

    offset: int = 0
    next_offset: int = 0
    tokens: int = 0
    embedded: bool = False  # the token embedding has run in this call
    outputs: dict[int, tuple[weakref.ref[Tensor], str]] = field(default_factory=dict)
    # Modules that run before the token embedding (a RoPE table): their step's offset is not known
    # yet when they run, so they are compared only call against whole call, never sliced.
    pre_embedding: set[str] = field(default_factory=set)

    def alias_of(self, tensors: list[Tensor]) -> str | None:
        if len(tensors) != 1:
            return None
        known = self.outputs.get(id(tensors[0]))
        return known[1] if known is not None and known[0]() is tensors[0] else None

    def remember(self, tensors: list[Tensor], name: str) -> None:
        if len(tensors) == 1:
            self.outputs[id(tensors[0])] = (weakref.ref(tensors[0]), name)


Handler = Callable[[str, str, Entry | None, list[Tensor], "SideState", bool], None]


class Pairing:
    """The shared state of one paired forward call and the hooks that drive it."""

    def __init__(self, recompute: bool = True, heads: dict[str, Callable[..., Any]] | None = None) -> None:
        """``heads``: baseline modules whose forward was stubbed out (name -> the real forward)."""
        self.heads = heads or {}
        self.pending: dict[str, deque[Entry]] = {}
        self.base = SideState()
        self.patched = SideState()
        self.blocked_on: Entry | None = None  # the baseline is parked after handing this over
        self.base_done = False
        self.patched_done = False
        self.base_error: BaseException | None = None
        self.allow_recompute = recompute
        self.recomputing = False
        self.seq = 0
        self.deferred: deque[Entry] = deque()
        self.dropped: list[Entry] = []
        self.stack: list[str] = []  # patched modules now running (innermost last)
        self.recent: dict[str, Entry] = {}  # the latest baseline entry per name (tensors dropped once done)
        self._base: greenlet.greenlet | None = None
        self._main: greenlet.greenlet | None = None

    # -- per call --------------------------------------------------------------------------------

    def start_call(self, offset: int, tokens: int, run_base: Callable[[], None]) -> None:
        """Prepare one paired call; ``run_base`` (the baseline forward) starts at the first switch."""
        self.base_done = self.patched_done = False
        self.base_error = None
        self.blocked_on = None
        self.stack.clear()
        self.recent.clear()
        for side in (self.base, self.patched):
            side.offset = side.next_offset = offset
            side.tokens = tokens
            side.embedded = False
            side.outputs.clear()

        def main() -> None:
            try:
                run_base()
            except Aborted:
                pass
            except Exception as exc:  # reported after the patched run has stopped
                self.base_error = exc
            finally:
                self.base_done = True
                self.blocked_on = None

        self._main = greenlet.getcurrent()
        self._base = greenlet.greenlet(main)

    def advance_base(self) -> None:
        """Run the baseline until it hands over its next module output (or ends)."""
        if self.base_done or self._base is None or self._base.dead:
            return
        self.blocked_on = None
        self._base.switch()

    def finish_patched(self) -> None:
        """The patched forward returned: let the baseline run to its end without parking."""
        self.patched_done = True
        while not self.base_done and self._base is not None and not self._base.dead:
            self.advance_base()

    def stop(self) -> None:
        """The patched run failed: unwind the baseline's stack."""
        if self._base is not None and not self._base.dead and self._base:
            self._base.throw(Aborted)
        self.base_done = True

    def leftovers(self) -> list[Entry]:
        """Baseline outputs never matched in this call (and those dropped for memory)."""
        out = [e for q in self.pending.values() for e in q if e.covered == 0] + self.dropped
        self.pending.clear()
        self.deferred.clear()
        self.dropped = []
        return out

    # -- position tracking: the token embedding's calls give each step's offset and length --------

    def embedding_pre_hook(self, side: SideState) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            ids = args[0] if args else None
            if isinstance(ids, Tensor) and ids.dim() >= 1:
                side.offset = side.next_offset
                side.tokens = int(ids.shape[-1])
                side.next_offset += side.tokens
                side.embedded = True

        return hook

    # -- the baseline side ------------------------------------------------------------------------

    def base_hook(self, name: str) -> Callable[..., None]:
        cname = canonical(name)

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if self.recomputing:
                return
            tensors = float_tensors(output)
            if not tensors:
                return
            side = self.base
            alias = side.alias_of(tensors)
            side.remember(tensors, cname)
            pos_dims = [position_dim(t, side.tokens) for t in tensors]
            entry = Entry(-1, cname, tensors, pos_dims, side.offset, side.tokens, [None] * len(tensors), alias)
            if self.patched_done:
                entry.tensors = []  # nothing will compare it: a leftover
                self._push(entry)
                return
            aliased = self.recent.get(alias) if alias is not None else None
            if aliased is not None and aliased.recompute is not None:
                entry.tensors, entry.recompute = [], aliased.recompute  # the same big tensor: keep nothing
            elif cname in self.heads and len(tensors) == 1 and pos_dims[0] is not None:
                entry.tensors = []  # the stub computed nothing: recompute from the inputs when compared
                entry.recompute = Recompute(self.heads[cname], args, dict(kwargs), None, None)
            elif self.allow_recompute and aliased is None:
                entry.recompute = self._recompute_plan(module, args, kwargs, tensors, pos_dims, side.tokens)
                if entry.recompute is not None:
                    entry.tensors = []
            if aliased is not None and aliased.x_sq and all(x is not None for x in aliased.x_sq):
                entry.x_sq = list(aliased.x_sq)
            elif entry.recompute is None:
                from speedtrap.localize._stats import as_rows, row_sq_norms

                entry.x_sq = [row_sq_norms(as_rows(t, d)) for t, d in zip(tensors, pos_dims, strict=True)]
            self._push(entry)
            if entry.recompute is not None:
                return  # cheap to keep: do not park, let the big output be freed
            self.blocked_on = entry
            assert self._main is not None
            self._main.switch()  # park until the patched side has compared it (or released it)

        return hook

    def _push(self, entry: Entry) -> None:
        self.seq += 1
        entry.seq = self.seq
        self.recent[entry.name] = entry
        self.pending.setdefault(entry.name, deque()).append(entry)

    def _recompute_plan(
        self,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        tensors: list[Tensor],
        pos_dims: list[int | None],
        tokens: int,
    ) -> Recompute | None:
        if len(tensors) != 1 or pos_dims[0] is None or tokens < 2:
            return None
        inputs = float_tensors(list(args)) + float_tensors(kwargs)
        if not inputs or any(position_dim(t, tokens) is None for t in inputs):
            return None
        if tensors[0].numel() < RECOMPUTE_RATIO * sum(t.numel() for t in inputs):
            return None
        from speedtrap.localize._stats import as_rows

        rows = as_rows(tensors[0], pos_dims[0])
        return Recompute(module.forward, args, dict(kwargs), rows[0].clone(), rows[-1].clone())

    # -- the patched side -------------------------------------------------------------------------

    def patched_pre_hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            if self.recomputing:
                return
            self.stack.append(name)
            if self.blocked_on is None:
                self.advance_base()  # alternate: the baseline computes this module first

        return hook

    def patched_hook(self, name: str, base_names: set[str], peek: bool, on_match: Handler) -> Callable[..., None]:
        """``peek``: this is ``X.inner`` and the wrapper ``X`` exists: compare, leave the entry to X."""
        cname = canonical(name)

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if self.recomputing:
                return
            if self.stack and self.stack[-1] == name:
                self.stack.pop()
            tensors = float_tensors(output)
            if not tensors:
                return
            side = self.patched
            if not side.embedded:
                side.pre_embedding.add(cname)
            alias = side.alias_of(tensors)
            side.remember(tensors, cname)
            entry = self._wait_for(cname) if cname in base_names else None
            try:
                on_match(name, alias or "", entry, tensors, side, peek)
            except Exception as exc:
                raise CompareError(f"comparing module {name!r} failed: {type(exc).__name__}: {exc}") from exc
            if entry is not None and not peek and entry.covered >= entry.tokens:
                entry.done = True
            if entry is not None and entry.done:
                self._remove(entry)
                entry.tensors = []
                if self.blocked_on is entry:
                    self.blocked_on = None

        return hook

    def _wait_for(self, cname: str) -> Entry | None:
        while True:
            q = self.pending.get(cname)
            if q:
                return q[0]
            if self.base_done:
                return None
            blocked = self.blocked_on
            if blocked is not None and blocked.name != cname:
                self._defer(blocked)
            self.advance_base()

    def _defer(self, entry: Entry) -> None:
        """Let the baseline go on past ``entry``, keeping it for a later match within a budget."""
        entry.released = True
        self.blocked_on = None
        self.deferred.append(entry)
        total = sum(e.nbytes() for e in self.deferred if not e.done)
        while total > DEFERRED_BUDGET_BYTES and self.deferred:
            old = self.deferred.popleft()
            if old.done:
                continue
            total -= old.nbytes()
            self._remove(old)
            old.tensors = []
            self.dropped.append(old)

    def _remove(self, entry: Entry) -> None:
        q = self.pending.get(entry.name)
        if q is not None and entry in q:
            q.remove(entry)
            if not q:
                del self.pending[entry.name]


def register(
    pairing: Pairing,
    base: nn.Module,
    patched: nn.Module,
    on_match: Handler,
) -> list[torch.utils.hooks.RemovableHandle]:
    """Hook every module of both trees; returns the handles to remove."""
    handles: list[torch.utils.hooks.RemovableHandle] = []
    base_names = {canonical(n) for n, _ in base.named_modules()}
    for tree, side in ((base, pairing.base), (patched, pairing.patched)):
        embedding = token_embedding(tree.named_modules())
        if embedding is not None:
            handles.append(embedding.register_forward_pre_hook(pairing.embedding_pre_hook(side)))
    for name, module in base.named_modules():
        handles.append(module.register_forward_hook(pairing.base_hook(name), with_kwargs=True))
    patched_names = {n for n, _ in patched.named_modules()}
    for name, module in patched.named_modules():
        peek = canonical(name) != name and canonical(name) in patched_names
        handles.append(module.register_forward_pre_hook(pairing.patched_pre_hook(name)))
        handles.append(
            module.register_forward_hook(pairing.patched_hook(name, base_names, peek, on_match), with_kwargs=True)
        )
    return handles


def token_embedding(modules: Iterable[tuple[str, nn.Module]]) -> nn.Embedding | None:
    """The token embedding: the nn.Embedding with the largest table."""
    best: nn.Embedding | None = None
    for _, module in modules:
        if isinstance(module, nn.Embedding) and (best is None or module.num_embeddings > best.num_embeddings):
            best = module
    return best
