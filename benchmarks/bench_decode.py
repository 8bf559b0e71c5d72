"""Greedy decoding: batched against one at a time (smol-moe, ``hf:`` targets), and llama.cpp on the same GGUF.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_decode.py [--batches 1,4,10,20] [--steps 16]
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_decode.py --target hf:qwen3_moe [--set key=value ...]

For each batch size B, B prompts of ``--prompt`` tokens are prefilled, then ``--steps`` decode steps
are timed three ways, interleaved in one run (so the machine's load hits every side alike):

- batched: ``InProcessModel.decode_step`` with all B sequences, one forward a step (the engine's way);
- one at a time: the same steps, one sequence per ``decode_step`` (what a batch of 1 costs, B times);
- old: one token per forward with no padding rows (the engine before batching: a 1-row GEMV).

smol-moe batches with its own ragged cache (one forward for all rows); an ``hf:`` target (``--target``,
config overrides with ``--set`` as the CLI takes them) batches in lockstep (a forward per sequence, the
weight GEMMs shared: ``speedtrap.targets._lockstep``), so its rows also print the GEMMs a step.

The tokens/s of each and the ratios are printed. With ``--llama`` (llama-cpp-python, the dev extra),
llama.cpp decodes one sequence of the same GGUF with the same thread count (``Llama.eval`` one token
at a time: the engine behind its server, without HTTP); it reads the GGUF's 4-bit weights, smol-moe
its float32 copy, so this compares engines, not formats.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from speedtrap.targets import InProcessModel, load_target, parse_overrides


def prefilled(model: InProcessModel, batch: int, prompt: int) -> tuple[list[object], list[int]]:
    caches, tokens = [], []
    for i in range(batch):
        cache = model.new_cache()
        ids = model.synthetic_ids(f"prompt {i}", prompt)
        tokens.append(int(model.logits(ids, cache)[-1].argmax()))
        caches.append(cache)
    return caches, tokens


def timed_batched(model: InProcessModel, batch: int, prompt: int, steps: int) -> float:
    caches, tokens = prefilled(model, batch, prompt)
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens = [int(t) for t in model.decode_step(tokens, caches).argmax(-1)]
    return time.perf_counter() - t0


def timed_single(model: InProcessModel, batch: int, prompt: int, steps: int, old: bool) -> float:
    caches, tokens = prefilled(model, batch, prompt)
    t0 = time.perf_counter()
    for i in range(batch):
        token = tokens[i]
        for _ in range(steps):
            row = model.logits([token], caches[i])[-1] if old else model.decode_step([token], [caches[i]])[0]
            token = int(row.argmax())
    return time.perf_counter() - t0


def llama_tps(gguf: str, threads: int, prompt: int, steps: int) -> float:
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=prompt + steps + 8, verbose=False)
    ids = [int(t) for t in llm.tokenize(b"The quick brown fox " * (prompt // 4))][:prompt]
    llm.eval(ids)
    token = int(llm.tokenize(b" and", add_bos=False)[0])
    t0 = time.perf_counter()
    for _ in range(steps):
        llm.eval([token])
    return steps / (time.perf_counter() - t0)


def gemm_costs(model: InProcessModel, repeats: int = 20) -> None:
    """Milliseconds of one ``F.linear`` on the model's largest weight at 1, 4 and 20 rows (what padding
    a step to 4 rows costs here), and of one decode forward: plain, and alone through lockstep."""
    import torch.nn.functional as F

    weight = max((p for p in model.model.parameters() if p.dim() == 2), key=lambda p: p.numel())
    cells = []
    for rows in (1, 4, 20):
        x = torch.randn(rows, weight.shape[1])
        F.linear(x, weight)
        t0 = time.perf_counter()
        for _ in range(repeats):
            F.linear(x, weight)
        cells.append(f"{rows} rows {(time.perf_counter() - t0) / repeats * 1e3:.2f} ms")
    print(f"F.linear on the {tuple(weight.shape)} weight: " + ", ".join(cells))
    caches, tokens = prefilled(model, 1, 16)
    plain, locked = [], []
    with torch.inference_mode():
        for _ in range(repeats // 2):
            t0 = time.perf_counter()
            model.logits([tokens[0]], caches[0])
            plain.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            model.decode_step([tokens[0]], caches)
            locked.append(time.perf_counter() - t0)
    print(f"one decode forward: plain (1-row GEMMs) {sum(plain) / len(plain) * 1e3:.1f} ms, "
          f"decode_step alone {sum(locked) / len(locked) * 1e3:.1f} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,4,10,20")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--llama", action="store_true", help="also llama.cpp (llama-cpp-python) on the same GGUF")
    parser.add_argument("--target", default="smol-moe", help="smol-moe or hf:<model type | directory>")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--costs", action="store_true", help="first: a GEMM at 1, 4, 20 rows; one forward")
    args = parser.parse_args()
    model = load_target(args.target, parse_overrides(args.set))
    threads = torch.get_num_threads()
    weights = sum(p.numel() * p.element_size() for p in model.model.parameters()) / 1e6
    print(f"{args.target} {' '.join(args.set)} ({weights:.0f} MB of weights); load average "
          f"{os.getloadavg()[0]:.2f}; torch threads {threads}; prompt {args.prompt} tokens, "
          f"{args.steps} steps")  # fmt: skip
    if args.costs:
        gemm_costs(model)
    cols = ["batch", "batched tok/s", "one at a time tok/s", "old (no padding) tok/s", "batched / one at a time"]
    print("| " + " | ".join([*cols, "batched / old", "GEMMs a step: batched / one at a time"]) + " |")
    print("|---|---|---|---|---|---|---|")
    for b in (int(x) for x in args.batches.split(",")):
        n = b * args.steps
        gemms = model.lockstep_stats.gemms
        batched = n / timed_batched(model, b, args.prompt, args.steps)
        gemms_batched = (model.lockstep_stats.gemms - gemms) / args.steps
        gemms = model.lockstep_stats.gemms
        single = n / timed_single(model, b, args.prompt, args.steps, old=False)
        gemms_single = (model.lockstep_stats.gemms - gemms) / args.steps
        old = n / timed_single(model, b, args.prompt, args.steps, old=True)
        print(f"| {b} | {batched:.1f} | {single:.1f} | {old:.1f} | {batched / single:.2f}x | {batched / old:.2f}x "
              f"| {gemms_batched:.0f} / {gemms_single:.0f} |", flush=True)  # fmt: skip
    if args.llama and args.target == "smol-moe":
        from speedtrap.targets.smolmoe.fetch import fetch_gguf

        tps = llama_tps(str(fetch_gguf()), threads, args.prompt, args.steps * 4)
        print(f"llama.cpp (llama-cpp-python Llama.eval, {threads} threads, one sequence): {tps:.1f} tok/s")


if __name__ == "__main__":
    main()
