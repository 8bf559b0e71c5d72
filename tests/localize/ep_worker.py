"""One rank of a tiny tensor- and expert-parallel MoE, with speedtrap's agent attached (torch.distributed, gloo).

    python ep_worker.py FOLDER RANK WORLD PORT VARIANT

Every rank builds the same full weights (a fixed seed) and keeps its share: the dense MLP is
tensor-parallel (``gate_up_proj`` column-parallel in two blocks, ``down_proj`` row-parallel, all-reduced
inside), the MoE's experts are split over the ranks (expert ``e`` on rank ``e * world // E``) and the
MoE unit's output is each rank's partial sum, all-reduced by the decoder layer after it (as vLLM and
SGLang do with ``reduce_results=False``). WORLD 1 is the single-process ground truth.

VARIANT: ``once`` (the factor applied once), ``twice`` (applied twice: the bug), ``half`` (the experts
of the second half apply it once more: a rank-dependent bug), ``skew`` (rank 1's first norm differs: a
replicated output the ranks disagree on), ``inside`` (as ``once``, the MoE unit all-reducing its own output
while its shared experts' stays a partial sum: vLLM's Glm4 MoE under TP).

The harness side writes ``FOLDER/requests/<n>.json`` (``{"ids": [...]}``); every rank runs one forward
on it and writes ``<n>.<rank>.done``; ``stop`` in the folder ends it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn

H, INTER, E, TOP, VOCAB, LAYERS = 32, 16, 8, 2, 64, 2


def _all_reduce(x: torch.Tensor, world: int) -> torch.Tensor:
    if world > 1:
        dist.all_reduce(x)
    return x


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * self.weight


class MergedColumnParallelLinear(nn.Module):
    """Blocks of ``output_sizes``; this rank holds each block's slice (``gather_output`` False)."""

    gather_output = False

    def __init__(self, full: torch.Tensor, output_sizes: list[int], rank: int, world: int) -> None:
        super().__init__()
        self.output_sizes = output_sizes
        blocks, start = [], 0
        for size in output_sizes:
            block = full[start : start + size]
            step = size // world
            blocks.append(block[rank * step : (rank + 1) * step])
            start += size
        self.weight = nn.Parameter(torch.cat(blocks), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class RowParallelLinear(nn.Module):
    def __init__(self, full: torch.Tensor, rank: int, world: int, reduce_results: bool = True) -> None:
        super().__init__()
        step = full.shape[1] // world
        self.weight = nn.Parameter(full[:, rank * step : (rank + 1) * step].clone(), requires_grad=False)
        self.world = world
        self.reduce_results = reduce_results

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x @ self.weight.T
        return _all_reduce(out, self.world) if self.reduce_results else out


class ColumnParallelLinear(nn.Module):
    gather_output = False

    def __init__(self, full: torch.Tensor, rank: int, world: int) -> None:
        super().__init__()
        step = full.shape[0] // world
        self.weight = nn.Parameter(full[rank * step : (rank + 1) * step].clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T


class SharedMLP(nn.Module):
    """Tensor-parallel shared expert: its output is this rank's partial sum (the down projection not reduced)."""

    def __init__(self, gen: torch.Generator, rank: int, world: int) -> None:
        super().__init__()
        self.up_proj = ColumnParallelLinear(torch.randn(INTER, H, generator=gen) / H**0.5, rank, world)
        self.down_proj = RowParallelLinear(torch.randn(H, INTER, generator=gen) / INTER**0.5, rank, world, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.up_proj(x)))


class DenseMLP(nn.Module):
    def __init__(self, gen: torch.Generator, rank: int, world: int) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            torch.randn(2 * INTER, H, generator=gen) / H**0.5, [INTER, INTER], rank, world
        )
        self.down_proj = RowParallelLinear(torch.randn(H, INTER, generator=gen) / INTER**0.5, rank, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(nn.functional.silu(gate) * up)


class Expert(nn.Module):
    def __init__(self, gen: torch.Generator) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(INTER, H, generator=gen) / H**0.5, requires_grad=False)
        self.w2 = nn.Parameter(torch.randn(H, INTER, generator=gen) / INTER**0.5, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.silu(x @ self.w1.T) @ self.w2.T


class Experts(nn.Module):
    """The experts this rank holds; its output is this rank's partial sum (``reduce_results`` False)."""

    reduce_results = False

    def __init__(self, gen: torch.Generator, rank: int, world: int, factor: float, half: bool) -> None:
        super().__init__()
        every = [Expert(gen) for _ in range(E)]  # built in full on every rank: the same weights
        self.held = [e for e in range(E) if e * world // E == rank]
        self.local = nn.ModuleList(every[e] for e in self.held)
        self.second_half = half
        if half:
            self.routed_scaling_factor = factor  # the bug: the second half's experts apply it once more

    def forward(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for expert, e in zip(self.local, self.held, strict=True):
            hit = (ids == e).any(-1)
            if not bool(hit.any()):
                continue
            w = (weights * (ids == e)).sum(-1, keepdim=True)[hit]
            y = w * expert(x[hit])
            if self.second_half and e >= E // 2:
                y = y * self.routed_scaling_factor
            out[hit] += y
        return out


class MoE(nn.Module):
    def __init__(self, gen: torch.Generator, rank: int, world: int, variant: str) -> None:
        super().__init__()
        # ``inside``: the unit all-reduces its own output (vLLM's and SGLang's Glm4 MoE under TP); else the
        # decoder layer does, after it, and the unit's output is a partial sum
        self.reduce_results = variant == "inside"
        self.world = world
        self.routed_scaling_factor = 2.5
        self.twice = variant == "twice"
        self.gate = nn.Linear(H, E, bias=False)
        with torch.no_grad():
            self.gate.weight.copy_(torch.randn(E, H, generator=gen))
        self.experts = Experts(gen, rank, world, self.routed_scaling_factor, variant == "half")
        self.shared_experts = SharedMLP(gen, rank, world)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.gate(x).softmax(-1)
        weights, ids = probs.topk(TOP, dim=-1)
        routed = self.experts(x, ids, weights) * self.routed_scaling_factor
        if self.twice:
            routed = routed * self.routed_scaling_factor
        out = routed + self.shared_experts(x)
        return _all_reduce(out, self.world) if self.reduce_results else out


class Layer(nn.Module):
    def __init__(self, gen: torch.Generator, rank: int, world: int, variant: str) -> None:
        super().__init__()
        skew = variant == "skew" and rank == 1
        self.norm1 = RMSNorm(torch.ones(H) * (1.01 if skew else 1.0))
        self.mlp = DenseMLP(gen, rank, world)
        self.norm2 = RMSNorm(torch.ones(H))
        self.moe = MoE(gen, rank, world, variant)
        self.world = world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mlp(self.norm1(x))
        moe = self.moe(self.norm2(x))
        return x + (moe if self.moe.reduce_results else _all_reduce(moe, self.world))


class Model(nn.Module):
    def __init__(self, rank: int, world: int, variant: str) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(1234)
        self.embed = nn.Embedding(VOCAB, H)
        with torch.no_grad():
            self.embed.weight.copy_(torch.randn(VOCAB, H, generator=gen))
        self.layers = nn.ModuleList(Layer(gen, rank, world, variant) for _ in range(LAYERS))
        self.norm = RMSNorm(torch.ones(H))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def main() -> None:
    folder, rank, world, port, variant = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    import speedtrap_agent  # on sys.path as in an engine (the agent's folder on PYTHONPATH)

    model = Model(rank, world, variant).eval()
    speedtrap_agent.attach(SimpleNamespace(model=model), "test-ep")
    requests = folder / "requests"
    requests.mkdir(parents=True, exist_ok=True)
    n = 0
    while not (folder / "stop").exists():
        path = requests / f"{n}.json"
        if not path.exists():
            time.sleep(0.02)
            continue
        ids = torch.tensor(json.loads(path.read_text())["ids"], dtype=torch.long)
        with torch.inference_mode():
            model(input_ids=ids, positions=torch.arange(ids.numel()))
        (requests / f"{n}.{rank}.done").write_text("ok")
        n += 1
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
