"""Q questions sharing one conversation prefix, in-process: their cost against one prefill, and against Q.

    .venv/bin/python benchmarks/bench_probe_prefix.py [--length 1024] [--questions 4] [--rounds 3]

One conversation of ``--length`` tokens holds ``--questions`` planted facts; each question is its own
request. Measured side by side, interleaved round by round (so a drifting machine load hits every
side alike), median of the rounds:

- single: one question's prompt on a cold engine, up to its first answer token: the unit;
- shared: all Q questions on one engine (the conversation prefix computed once, each question run
  through a copy of its KV cache), up to each first answer token;
- naive: all Q questions, each on a cold engine (the prefix computed Q times).

Run it when `uptime` shows a low load; the threads line says what torch used.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import torch

from speedtrap.probe import Engine, build_conversation
from speedtrap.targets.smolmoe import SmolMoETarget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = SmolMoETarget().load()
    depths = tuple((i + 0.5) / args.questions for i in range(args.questions))

    async def count(messages: list[dict[str, str]]) -> int:
        return len(model.chat_ids(messages))

    conv, tokens = asyncio.run(build_conversation("bench", args.length, depths, 0, count))
    print(f"load average {os.getloadavg()[0]:.2f}; torch threads {torch.get_num_threads()}; "
          f"{len(conv.facts)} questions on one {tokens}-token conversation, {args.rounds} rounds")  # fmt: skip

    def single() -> None:
        Engine(model).chat(conv.messages(conv.facts[0]), 1)

    def shared() -> None:
        engine = Engine(model)  # a cold prefix cache each round
        for f in conv.facts:
            engine.chat(conv.messages(f), 1)
        assert engine.prefills == 1

    def naive() -> None:
        for f in conv.facts:
            Engine(model).chat(conv.messages(f), 1)

    timings: dict[str, list[float]] = {"single": [], "shared": [], "naive": []}
    single()  # warm up
    for _ in range(args.rounds):
        for name, fn in (("single", single), ("shared", shared), ("naive", naive)):
            t0 = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in timings.items()}
    for name in ("single", "shared", "naive"):
        print(f"{name:>6}: {med[name]:.2f} s  ({med[name] / med['single']:.2f}x a single prefill)")
    ok = med["shared"] <= 1.5 * med["single"]
    print(f"goal: shared <= 1.5x single -> {'met' if ok else 'NOT met'} ({med['shared'] / med['single']:.2f}x; "
          f"naive {med['naive'] / med['single']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
