"""Cross-engine divergence: ``speedtrap serve --dialect sglang`` (smol-moe, SGLang 0.5.23's answers)
against in-process references of the same GGUF file: smol-moe itself and the plain transformers model.

    .venv/bin/python benchmarks/bench_cross_engine.py [--lengths 512] [--decode-tokens 16] [--top-k 20] \
        [--references smol-moe,hf]

Prints one JSON line per (reference, --api) pair: KL mean/p99/max, same-top-1 and the tokens compared
per phase, the text names mapped to ids (the openai dialect: SGLang's /v1/completions names tokens by
text), and the engines each side reported. The server runs on loopback with one torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from speedtrap.probe import DivergenceSettings, HttpBackend, InProcessBackend, run_divergence
from speedtrap.targets import resolve_target
from speedtrap.targets.smolmoe.weights import default_gguf_path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(port: int, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", str(port),
            "--threads", "1", "--dialect", "sglang"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEEDTRAP_SMOLMOE_")}
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
    for _ in range(1200):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"server did not start: {log.read_text()[-2000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512")
    parser.add_argument("--decode-tokens", type=int, default=16)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--references", default="smol-moe,hf", help="which in-process references: smol-moe, hf")
    args = parser.parse_args()
    settings = DivergenceSettings(
        lengths=tuple(int(n) for n in args.lengths.split(",")), decode_tokens=args.decode_tokens, top_k=args.top_k
    )
    port = _port()
    proc = _start(port, Path("/tmp/bench_cross_engine_serve.log"))
    try:
        specs = {"smol-moe": "smol-moe", "hf": f"hf:{default_gguf_path()}"}
        for name in args.references.split(","):
            label, model = f"{name} (in-process)", resolve_target(specs[name]).load()
            for api in ("openai", "sglang"):
                server = HttpBackend(f"http://127.0.0.1:{port}", "smol-moe", api=api)  # type: ignore[arg-type]
                started = time.perf_counter()
                report = run_divergence(InProcessBackend(model, name=label), server, settings, progress=False)
                row = {"reference": label, "api": api, "seconds": round(time.perf_counter() - started, 1)}
                for phase, div in report.phases.items():
                    o = div.overall
                    row[phase] = {"tokens": o.tokens, "kl_mean": o.kl_mean, "kl_p99": o.kl_p99, "kl_max": o.kl_max,
                                  "same_top1": o.same_top1}  # fmt: skip
                row["keys"] = {k: v for k, v in report.keys.items() if k != "note"}
                row["engines"] = report.engines
                print(json.dumps(row), flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
