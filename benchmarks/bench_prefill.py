"""Long prefills on smol-moe: one at a time with every core, against independent prefills in parallel.

    .venv/bin/python benchmarks/bench_prefill.py [--prompts 4] [--tokens 1280] [--threads 2]

Issue 30 asks whether prefill work can be shared out: the demo's recall questions each have their
own conversation, so their prefills are independent. This times ``--prompts`` prefills of
``--tokens`` tokens (the demo's long length, vocabulary projection skipped as the engine's prefix
cache does) three ways, one after another in one run:

- one at a time with ``--threads`` torch threads (the engine's way);
- one at a time with one torch thread (what each parallel worker gets);
- ``--threads`` Python workers at once, one torch thread each (torch releases the GIL inside its
  kernels, so this is as parallel as separate processes, without a second copy of the weights).

It prints the seconds of each and the ratio of the engine's way to the parallel one.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections.abc import Callable

import torch

from speedtrap.targets import InProcessModel
from speedtrap.targets.smolmoe import SmolMoETarget


def prefill(model: InProcessModel, ids: list[int]) -> None:
    cache = model.new_cache()
    with torch.inference_mode():
        model.logits(ids, cache)


def timed(fn: Callable[..., None], *args: object) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def sequential(model: InProcessModel, prompts: list[list[int]]) -> None:
    for ids in prompts:
        prefill(model, ids)


def parallel(model: InProcessModel, prompts: list[list[int]], workers: int) -> None:
    threads = [threading.Thread(target=sequential, args=(model, prompts[i::workers])) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=1280)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    model = SmolMoETarget().load()
    prompts = [model.synthetic_ids(f"conversation {i}", args.tokens) for i in range(args.prompts)]
    head = model.model.lm_head
    model.model.lm_head = torch.nn.Identity()  # no vocabulary projection: the engine skips it for a prefix
    try:
        torch.set_num_threads(args.threads)
        prefill(model, prompts[0])  # warm-up
        engine_way = timed(sequential, model, prompts)
        torch.set_num_threads(1)
        one_thread = timed(sequential, model, prompts)
        shared_out = timed(parallel, model, prompts, args.threads)
    finally:
        model.model.lm_head = head
    n, t = args.prompts, args.tokens
    print(f"{n} prefills of {t} tokens:")
    print(f"  one at a time, {args.threads} torch threads: {engine_way:.1f} s ({engine_way / n:.2f} s each)")
    print(f"  one at a time, 1 torch thread:  {one_thread:.1f} s ({one_thread / n:.2f} s each)")
    print(f"  {args.threads} workers at once, 1 thread each: {shared_out:.1f} s")
    print(
        f"  threads' speed-up on one prefill: {one_thread / engine_way:.2f}x; parallel workers against it: "
        f"{engine_way / shared_out:.2f}x"
    )


if __name__ == "__main__":
    main()
