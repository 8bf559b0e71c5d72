"""On-the-fly comparison statistics of two activations, per module and per position bucket.

``rel_diff = 1 - 2*sum(x*y) / sum(x*x + y*y)`` (SGLang's comparator metric) is computed in its
algebraically identical, cancellation-free form ``sum((x-y)**2) / sum(x*x + y*y)``: the direct form
loses every digit below ~1e-16 relative (float64) or ~1e-7 (float32) to cancellation, while the
harmless kernel swaps this tool must tell apart sit at 1e-12..1e-14. Elementwise work stays in the
activations' own dtype (one subtraction, exact for close values), per-position partial sums are
taken row by row (relative error ~1e-7 of each sum: every term is positive, nothing cancels) and
everything is accumulated in float64. Nothing is kept but these sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

ROW_CHUNK_ELEMENTS = 1 << 20  # rows are processed in chunks of about 4 MiB of float32


def position_edges(tokens: int, first: int = 16) -> list[int]:
    """Bucket edges over positions ``[0, tokens)``: 0, 16, 32, 64, ... doubling, then ``tokens``."""
    edges = [0]
    edge = first
    while edge < tokens:
        edges.append(edge)
        edge *= 2
    edges.append(max(tokens, 1))
    return edges


def as_rows(t: Tensor, pos_dim: int | None) -> Tensor:
    """``t`` as [positions, features] (position dim first); a tensor without one is one row."""
    if pos_dim is None:
        return t.reshape(1, -1)
    return t.movedim(pos_dim, 0).reshape(t.shape[pos_dim], -1)


def row_sq_norms(rows: Tensor) -> Tensor:
    """Per-row sum of squares, float64 (computed in chunks in the rows' own float dtype)."""
    parts = [torch.linalg.vector_norm(_floating(rows[a:b]), 2, dim=-1) for a, b in _chunks(rows)]
    return _joined(parts).double().square_() if parts else torch.zeros(0, dtype=torch.float64)


@dataclass
class Accumulator:
    """Running sums for one module over every call compared so far."""

    buckets: int
    dd: float = 0.0
    xx: float = 0.0
    yy: float = 0.0
    max_abs: float = 0.0
    elements: int = 0
    calls: int = 0
    bucket_dd: list[float] = field(default_factory=list)
    bucket_xx: list[float] = field(default_factory=list)
    bucket_yy: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("bucket_dd", "bucket_xx", "bucket_yy"):
            if not getattr(self, name):
                setattr(self, name, [0.0] * self.buckets)

    @property
    def rel_diff(self) -> float:
        denom = self.xx + self.yy
        return self.dd / denom if denom > 0 else (0.0 if self.dd == 0 else math.inf)

    @property
    def cosine(self) -> float:
        if self.xx <= 0 or self.yy <= 0:
            return 1.0 if self.xx == self.yy else 0.0
        return max(-1.0, min(1.0, (self.xx + self.yy - self.dd) / (2.0 * math.sqrt(self.xx * self.yy))))

    def bucket_rel(self) -> list[float | None]:
        out: list[float | None] = []
        for dd, xx, yy in zip(self.bucket_dd, self.bucket_xx, self.bucket_yy, strict=True):
            denom = xx + yy
            out.append(dd / denom if denom > 0 else (None if dd == 0 else math.inf))
        return out

    def merge_from(self, other: Accumulator) -> None:
        """Add another accumulator's sums (an aliased output compared once, counted twice)."""
        self.dd += other.dd
        self.xx += other.xx
        self.yy += other.yy
        self.max_abs = max(self.max_abs, other.max_abs)
        self.elements += other.elements
        for i in range(self.buckets):
            self.bucket_dd[i] += other.bucket_dd[i]
            self.bucket_xx[i] += other.bucket_xx[i]
            self.bucket_yy[i] += other.bucket_yy[i]


def compare_rows(
    x: Tensor,
    y: Tensor,
    positions: Tensor | None,
    edges: Sequence[int],
    acc: Accumulator,
    x_sq: Tensor | None = None,
) -> Accumulator:
    """Add one comparison of ``x`` (baseline) and ``y`` (patched), both [rows, features], to ``acc``.

    ``positions`` gives each row's token position (None: no position dimension); ``x_sq`` is the
    baseline's per-row sum of squares when the baseline side computed it already. Returns the
    sums of this comparison alone (the caller may reuse them for an aliased output). A handful of
    tensor operations per call: on a busy 2-core machine each small op costs, not only the bytes.
    """
    if x.shape[0] == 0:
        return Accumulator(acc.buckets)
    norms_d: list[Tensor] = []
    norms_y: list[Tensor] = []
    maxes: list[Tensor] = []
    for start, stop in _chunks(x):
        xs, ys = _floating(x[start:stop]), _floating(y[start:stop])
        if xs.dtype != ys.dtype:
            xs, ys = xs.double(), ys.double()
        d = torch.sub(xs, ys, out=_scratch(xs.shape, xs.dtype))
        norms_d.append(torch.linalg.vector_norm(d, 2, dim=-1))
        norms_y.append(torch.linalg.vector_norm(ys, 2, dim=-1))
        if d.numel():  # max |d| from the extremes: the inf-norm kernel is 15x slower than this
            low, high = torch.aminmax(d)
            maxes.append(torch.maximum(-low, high).double())
    xx = x_sq if x_sq is not None else row_sq_norms(x)
    table = torch.cat([_joined(norms_d), _joined(norms_y)]).double().square_().view(2, -1)
    table = torch.cat([table, xx.view(1, -1)])  # rows: dd, yy, xx
    one = Accumulator(acc.buckets)
    if positions is not None and acc.buckets:
        sums = torch.zeros(3, acc.buckets, dtype=torch.float64).index_add_(1, _bucket_index(positions, edges), table)
        one.bucket_dd, one.bucket_yy, one.bucket_xx = sums.tolist()
        one.dd, one.yy, one.xx = (math.fsum(row) for row in (one.bucket_dd, one.bucket_yy, one.bucket_xx))
    else:
        one.dd, one.yy, one.xx = table.sum(1).tolist()
    one.max_abs = float(torch.stack(maxes).max()) if maxes else 0.0
    one.elements = x.numel()
    acc.merge_from(one)
    return one


_SCRATCH: dict[torch.dtype, Tensor] = {}


def _scratch(shape: torch.Size, dtype: torch.dtype) -> Tensor:
    """A reused buffer for the difference of one chunk (no fresh pages to fault in per module)."""
    numel = shape.numel()
    buffer = _SCRATCH.get(dtype)
    if buffer is None or buffer.numel() < numel or buffer.is_inference() != torch.is_inference_mode_enabled():
        buffer = _SCRATCH[dtype] = torch.empty(max(numel, ROW_CHUNK_ELEMENTS), dtype=dtype)
    return buffer[:numel].view(shape)


def _joined(parts: list[Tensor]) -> Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


_BOUNDARIES: dict[tuple[int, ...], Tensor] = {}


def _bucket_index(positions: Tensor, edges: Sequence[int]) -> Tensor:
    inner = tuple(edges[1:-1])
    boundaries = _BOUNDARIES.get(inner)
    if boundaries is None:
        boundaries = _BOUNDARIES[inner] = torch.tensor(inner, dtype=torch.long)
    return torch.bucketize(positions, boundaries, right=True).clamp_(0, len(edges) - 2)


def _floating(t: Tensor) -> Tensor:
    """float32 and float64 stay as they are; half, bfloat16, float8 and integers become float32."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _chunks(rows: Tensor) -> list[tuple[int, int]]:
    per_row = max(1, rows[0].numel() if rows.shape[0] else 1)
    step = max(1, ROW_CHUNK_ELEMENTS // per_row)
    return [(start, min(start + step, rows.shape[0])) for start in range(0, rows.shape[0], step)]
