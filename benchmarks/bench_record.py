"""Recorded baselines: file size against full-vocabulary logits, and isolate recorded vs side by side.

1. Size: smol-moe's baseline recorded in-process (divergence, top-k 20, prefill and decode) against the
   float32 logits of the whole vocabulary that llama.cpp's ``--kl-divergence-base`` would store for the
   same positions (and, for scale, at Llama-3's vocabulary of 128,256).
2. Isolate over a ``speedtrap serve`` manifest (3 patches, the double routed scaling one of them), once
   with the default recorded reference and once with ``reference = "live"``: wall time, launches (trials
   plus the recording or reference launch), and the most servers of the stack alive at once.

``OMP_NUM_THREADS=1 python benchmarks/bench_record.py [--lengths 512,1024] [--isolate-length 64] [--skip-size]
[--skip-isolate]``
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

LLAMA3_VOCAB = 128_256


def size(lengths: tuple[int, ...], top_k: int) -> None:
    from speedtrap.probe import DivergenceSettings, InProcessBackend, record
    from speedtrap.targets.smolmoe import SmolMoETarget

    model = SmolMoETarget().load()
    settings = DivergenceSettings(lengths=lengths, sequences=1, decode_tokens=32, bucket_size=128, top_k=top_k)
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "base.strec"
        t0 = time.perf_counter()
        rec = record(InProcessBackend(model), out, divergence=settings, progress=False)
        took = time.perf_counter() - t0
        nbytes = out.stat().st_size
    positions = rec.summary()["positions"]
    vocab = int(model.config.get("vocab_size") or len(model.tokenizer))
    per_k = nbytes / positions * 1000
    full = 4 * vocab * 1000
    print(f"recording: {positions} positions (lengths {list(lengths)}, top-{top_k}), {nbytes:,} bytes, {took:.1f} s")
    print(f"  per 1,000 positions: {per_k:,.0f} bytes ({per_k / 1000:.1f} bytes a position)")
    print(f"  full float32 logits, vocabulary {vocab:,}: {full:,} bytes per 1,000 positions -> {full / per_k:,.0f}x")
    print(f"  at Llama-3's vocabulary ({LLAMA3_VOCAB:,}): {4 * LLAMA3_VOCAB * 1000 / per_k:,.0f}x")


class Watcher:
    """The most processes of the stack (tagged by a unique served name) alive at once."""

    def __init__(self, tag: str) -> None:
        self.tag, self.most, self.seen = tag, 0, set[int]()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            alive = set()
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                    except OSError:
                        continue
                    if self.tag.encode() in args:
                        alive.add(int(entry))
            self.seen |= alive
            self.most = max(self.most, len(alive))
            time.sleep(0.05)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


MANIFEST = """
[target]
launch = ["{python}", "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", "{{port}}", "--threads", "1",
          "--name", "{tag}"]
health = "http://127.0.0.1:{{port}}/health"
start_timeout = 600
config_args = ["--set", "{{key}}={{value}}"]
env = {{ OMP_NUM_THREADS = "1" }}

[[patches]]
name = "fused_rmsnorm"
env = {{ SPEEDTRAP_SMOLMOE_FUSED_RMSNORM = "1" }}
[[patches]]
name = "hash_topk_routed_scaling"
config = {{ apply_routed_scaling_factor_on_output = "true" }}
[[patches]]
name = "lm_head_bf16"
env = {{ SPEEDTRAP_SMOLMOE_LM_HEAD_BF16 = "1" }}

[probe]
kind = "divergence"
preset = "default"
settings = {{ lengths = [{length}], decode_tokens = 8, bucket_size = 64, top_k = 10 }}
reference = "{reference}"

[verdict]
metric = "worst.kl_p99"
bound = 0.1
repeats = 0
"""


def isolate_modes(length: int) -> None:
    from speedtrap.isolate import isolate
    from speedtrap.manifest import load_manifest

    rows = []
    with tempfile.TemporaryDirectory() as d:
        for reference in ("recorded", "live"):
            tag = f"bench-rec-{uuid.uuid4().hex[:8]}"
            path = Path(d) / f"{reference}.toml"
            path.write_text(MANIFEST.format(python=sys.executable, tag=tag, reference=reference, length=length))
            manifest = load_manifest(path)
            t0 = time.perf_counter()
            with Watcher(tag) as watch:
                result = isolate(manifest, Path(d) / reference)
            wall = time.perf_counter() - t0
            rows.append((reference, wall, result.launches, len(watch.seen), watch.most, result.culprit_names))
    print(f"isolate, speedtrap serve, 3 patches, divergence on {length} tokens:")
    print("| mode | wall s | trials | launches (all servers) | most servers at once | culprits |")
    print("|---|---|---|---|---|---|")
    for reference, wall, trials, launched, most, culprits in rows:
        names = ", ".join("+".join(c) for c in culprits)
        print(f"| {reference} | {wall:.1f} | {trials} | {launched} | {most} | {names} |")
    print(f"recorded / live wall time: {rows[0][1] / rows[1][1]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="512,1024")
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--isolate-length", type=int, default=256)
    parser.add_argument("--skip-isolate", action="store_true")
    parser.add_argument("--skip-size", action="store_true")
    args = parser.parse_args()
    if not args.skip_size:
        size(tuple(int(x) for x in args.lengths.split(",")), args.top_k)
    if not args.skip_isolate:
        isolate_modes(args.isolate_length)


if __name__ == "__main__":
    main()
