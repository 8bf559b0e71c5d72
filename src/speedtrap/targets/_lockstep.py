"""Lockstep decoding: several sequences' forwards run side by side, their weight GEMMs run together.

A model without its own batched decode (``batch_cache``: transformers models, a user's model) still
decodes a batch with one weight read per GEMM: each sequence's forward runs in a worker thread of its
own, exactly as it runs alone (its own cache, its own positions and masks, every op at the shape it has
alone), except its weight GEMMs: ``F.linear`` calls (``nn.Linear``, a router, an expert's slice of a 3-D
weight) and ``torch._grouped_mm`` calls (transformers' grouped experts). Those wait at a rendezvous
(a torch function mode in each worker); once every worker waits (or has finished), the coordinator runs
one GEMM per weight (per expert of a grouped call) over the rows of all the workers that asked for it
and hands each its rows back.

Bits: every GEMM runs on a multiple of :data:`MIN_BATCH_ROWS` rows (zero rows added), alone or
together, and a row of ``x @ W.T`` has the same bits for any multiple of 4 rows (torch's CPU GEMM; the
GEMMs always run on the coordinating thread). Everything else a sequence computes, it computes alone at
its own shapes. So a sequence's logits are the same bits alone (one worker) and in any batch. What
must hold for that: a forward depends on its input, its cache and the weights only; one that changes
module state (:func:`module_state` tells) cannot share a step with others.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from torch import Tensor, nn

T = TypeVar("T")

# A decode step runs its weight GEMMs on a multiple of this many rows (padding rows added): on torch's
# CPU GEMM (2.13, AVX2) a row's result is the same bits for any multiple of 4 rows, at 1, 2 or 3
# threads, and different at 1, 2 or 3 rows (another kernel) and at some other counts with 2 threads
# (5, 10: a thread's share is not a multiple of 4), so a sequence decodes to the same bits alone or in
# any batch (tests/probe/test_batched_decode.py and test_lockstep_decode.py check it, bit for bit).
MIN_BATCH_ROWS = 4

# A model with its own batched decode (``batch_cache``: smol-moe) runs every op of a step over all rows,
# not only the GEMMs, so its elementwise ops must not see the batch either. ATen's vectorized loops take
# two vectors a step (16 floats on AVX2, 32 on AVX-512) and leave the last elements of a contiguous
# tensor to scalar code, whose sigmoid and exp differ from the vector ones in the last bit: on an
# AVX-512 CPU, smol-moe's hyper-connection weights (4 values a row) went through scalar code at 4 rows
# and vector code at 8, and a batch changed a sequence's logits. With 8 rows at a time every row width
# smol-moe has (4, 16, 24, 108, 576, 1428 values) fills whole steps on both (tests/probe/test_batched_decode.py).
BATCH_CACHE_ROWS = 8


@dataclass
class LockstepStats:
    """What lockstep ran: GEMMs, the calls (``F.linear``, grouped) they served, GEMMs per weight."""

    gemms: int = 0
    calls: int = 0
    reads: Counter[int] = field(default_factory=Counter)  # GEMMs by the weight's data pointer

    def read(self, weight: Tensor) -> None:
        self.gemms += 1
        self.reads[weight.data_ptr()] += 1

    def add(self, other: LockstepStats) -> None:
        self.gemms += other.gemms
        self.calls += other.calls
        self.reads.update(other.reads)


@dataclass
class _Gemm:
    """One weight GEMM waiting at the rendezvous: ``F.linear(x, weight, bias)``, or with ``offs`` a
    grouped GEMM (``torch._grouped_mm(x, weight, offs=offs)``: rows ``offs[e-1]:offs[e]`` of ``x``
    times ``weight[e]``, the experts of an MoE)."""

    x: Tensor
    weight: Tensor
    bias: Tensor | None = None
    offs: Tensor | None = None
    out: Tensor | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def key(self) -> tuple[Any, ...]:
        w, b = self.weight, self.bias
        bias = None if b is None else (b.data_ptr(), tuple(b.shape), tuple(b.stride()), b.dtype)
        grouped = self.offs is not None
        return (grouped, w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype, w.device, bias, self.x.dtype)


class _Hub:
    """The rendezvous: workers post GEMMs and wait; the coordinator runs them once all workers wait."""

    def __init__(self, workers: int, rows: int) -> None:
        self.lock = threading.Lock()
        self.ready = threading.Event()  # set when no worker runs (all wait or have finished)
        self.running = workers
        self.waiting: list[_Gemm] = []
        self.rows = rows
        self.stats = LockstepStats()
        self.inline = workers == 1

    def _stop_running(self) -> None:
        with self.lock:
            self.running -= 1
            if self.running == 0:
                self.ready.set()

    def gemm(self, gemm: _Gemm) -> Tensor:
        """In a worker: post one GEMM, wait for its rows (a lone sequence's run on its own thread: the
        same GEMM on the same rows, without a thread handoff)."""
        if self.inline:
            self._run([gemm])
        else:
            with self.lock:
                self.waiting.append(gemm)
            self._stop_running()
            gemm.done.wait()
        if gemm.error is not None:
            raise gemm.error
        assert gemm.out is not None
        return gemm.out

    def finished(self) -> None:
        self._stop_running()

    def serve(self) -> None:
        """In the coordinator: until every worker has finished, run each round's GEMMs, one per weight."""
        while True:
            self.ready.wait()
            with self.lock:
                self.ready.clear()
                batch, self.waiting = self.waiting, []
            if not batch:
                return
            groups: dict[tuple[Any, ...], list[_Gemm]] = {}
            for gemm in batch:
                groups.setdefault(gemm.key(), []).append(gemm)
            for group in groups.values():
                self._run(group)
            with self.lock:
                self.running += len(batch)
            for gemm in batch:
                gemm.done.set()

    def _run(self, group: list[_Gemm]) -> None:
        import torch

        try:
            with torch.inference_mode():
                if group[0].offs is None:
                    self._linear(group)
                else:
                    self._grouped(group)
            self.stats.calls += len(group)
        except Exception as exc:  # handed to the workers, which raise it in their forwards
            for g in group:
                g.error = exc

    def _padded(self, pieces: list[Tensor]) -> Tensor:
        """``pieces`` stacked, with zero rows up to a multiple of ``rows`` (at least ``rows``)."""
        import torch

        total = sum(p.shape[0] for p in pieces)
        padded = max(self.rows, -(-total // self.rows) * self.rows)
        return torch.cat([*pieces, pieces[0].new_zeros(padded - total, pieces[0].shape[-1])])

    def _linear(self, group: list[_Gemm]) -> None:
        import torch.nn.functional as F

        flat = [g.x.reshape(-1, g.x.shape[-1]) for g in group]
        y = F.linear(self._padded(flat), group[0].weight, group[0].bias)
        self.stats.read(group[0].weight)
        lo = 0
        for g, f in zip(group, flat, strict=True):
            hi = lo + f.shape[0]
            g.out = y[lo:hi].reshape(*g.x.shape[:-1], y.shape[-1]).clone()
            lo = hi

    def _grouped(self, group: list[_Gemm]) -> None:
        """One GEMM per expert over every worker's rows for it (the experts' weights read once)."""
        import torch

        weight = group[0].weight
        bounds = []
        for g in group:
            assert g.offs is not None
            ends = [int(e) for e in g.offs.tolist()]
            bounds.append(list(zip([0, *ends[:-1]], ends, strict=True)))
            g.out = g.x.new_zeros(g.x.shape[0], weight.shape[-1])
        for e in range(weight.shape[0]):
            spans = [(g, lo, hi) for g, b in zip(group, bounds, strict=True) for lo, hi in [b[e]] if hi > lo]
            if not spans:
                continue
            y = torch.mm(self._padded([g.x[lo:hi] for g, lo, hi in spans]), weight[e])
            self.stats.read(weight[e])
            at = 0
            for g, lo, hi in spans:
                assert g.out is not None
                g.out[lo:hi] = y[at : at + hi - lo]
                at += hi - lo


def _linear_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    names = ("input", "weight", "bias")
    values = [*args, *([None] * (3 - len(args)))][:3]
    return tuple(kwargs.get(n, v) for n, v in zip(names, values, strict=True))  # type: ignore[return-value]


def _linear_gemm(x: Any, weight: Any, bias: Any) -> _Gemm | None:
    """The GEMM of an ``F.linear`` call on a 2-D weight (None: any other call runs as it is)."""
    import torch

    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)) or weight.dim() != 2 or x.dim() < 1:
        return None
    if x.dtype != weight.dtype or not (bias is None or (isinstance(bias, torch.Tensor) and bias.dim() == 1)):
        return None
    return _Gemm(x, weight, bias)


def _grouped_gemm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Gemm | None:
    """The GEMM of a ``torch._grouped_mm(x [S, K], w [E, K, N], offs=offs)`` call (None: another form)."""
    import torch

    if len(args) != 2 or set(kwargs) - {"offs", "bias", "out_dtype"}:
        return None
    x, weight = args
    offs, bias, out_dtype = kwargs.get("offs"), kwargs.get("bias"), kwargs.get("out_dtype")
    if bias is not None or not isinstance(offs, torch.Tensor) or not isinstance(x, torch.Tensor):
        return None
    if not isinstance(weight, torch.Tensor) or x.dim() != 2 or weight.dim() != 3 or x.dtype != weight.dtype:
        return None
    if out_dtype not in (None, x.dtype) or offs.shape != (weight.shape[0],):
        return None
    return _Gemm(x, weight, offs=offs)


def _rendezvous_mode(hub: _Hub) -> Any:
    """A torch function mode that sends a worker's ``F.linear`` calls on a 2-D weight to ``hub``."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    grouped_mm = getattr(torch, "_grouped_mm", None)

    class Rendezvous(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            kwargs = kwargs or {}
            gemm = None
            if func is F.linear:
                gemm = _linear_gemm(*_linear_args(args, kwargs))
            elif func is grouped_mm:
                gemm = _grouped_gemm(args, kwargs)
            return func(*args, **kwargs) if gemm is None else hub.gemm(gemm)

    return Rendezvous()


def lockstep(
    calls: Sequence[Callable[[], T]], rows: int = MIN_BATCH_ROWS, stats: LockstepStats | None = None
) -> list[T]:
    """Run ``calls`` (forwards, one per sequence) side by side, each in its own worker thread, their
    weight GEMMs run together on the calling thread (see the module's docstring). A single call runs
    on the calling thread, its GEMMs padded the same way. The workers use the calling thread's torch
    thread count, so an op a sequence computes alone has the same bits on either thread."""
    import torch

    if not calls:
        return []
    hub = _Hub(len(calls), rows)
    if hub.inline:  # alone: the forward runs here, its GEMMs exactly as a batch would run its rows
        with torch.inference_mode(), _rendezvous_mode(hub):
            result = calls[0]()
        if stats is not None:
            stats.add(hub.stats)
        return [result]
    threads = torch.get_num_threads()
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException | None] = [None] * len(calls)

    def work(i: int) -> None:
        try:
            torch.set_num_threads(threads)  # a new thread's OpenMP default may differ from ours
            with torch.inference_mode(), _rendezvous_mode(hub):
                results[i] = calls[i]()
        except BaseException as exc:  # re-raised on the calling thread
            errors[i] = exc
        finally:
            hub.finished()

    workers = [threading.Thread(target=work, args=(i,), name=f"lockstep-{i}", daemon=True) for i in range(len(calls))]
    for w in workers:
        w.start()
    hub.serve()
    for w in workers:
        w.join()
    if stats is not None:
        stats.add(hub.stats)
    for err in errors:
        if err is not None:
            raise err
    return results


def module_state(model: nn.Module) -> dict[str, Any]:
    """Every parameter, buffer and tensor attribute of ``model`` (identity and version) and every scalar
    attribute (value): a forward that changes any of them keeps state between forwards (a RoPE table
    rebuilt for a longer sequence, a call counter), so its sequences cannot share a step."""
    import torch

    state: dict[str, Any] = {}
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if attr in ("_parameters", "_buffers"):
                for key, tensor in value.items():
                    if isinstance(tensor, torch.Tensor):
                        state[f"{name}.{key}"] = (id(tensor), tensor._version)
            elif isinstance(value, torch.Tensor):
                state[f"{name}.{attr}"] = (id(value), value._version)
            elif value is None or isinstance(value, (bool, int, float, str)):
                state[f"{name}.{attr}"] = value
    return state
