"""Helpers of the probe tests: free ports and real servers started on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch

from speedtrap._errors import ServerError
from speedtrap.probe import RecallSettings
from speedtrap.targets._base import InProcessModel

THREADS = 1
SERVER_START_TIMEOUT = 600.0  # a model load on a busy 2-core machine can take minutes

# Up to 1,024 tokens: 2 lengths x 3 depths x 2 conversations = 12 questions over 4 prefixes.
GRID = RecallSettings(lengths=(256, 1024), depths=(0.1, 0.5, 0.9), samples=2, seed=0)
MLP_X15 = "mlp_x1.5_layers_0_2"  # the constructed change recall cannot see (conftest.ScaleMlpPatch)

# Subsets of GRID (same conversations: a conversation depends on its length, depth and sample only).
HTTP_GRID = RecallSettings(lengths=(256,), depths=(0.1, 0.9), samples=2, seed=0)  # 4 questions
LLAMA_GRID = RecallSettings(lengths=(256,), depths=(0.5,), samples=2, seed=0)  # 2 questions


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    proc: subprocess.Popen[str]
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def died(self) -> ServerError | None:
        """The HttpBackend ``watch``: a server that crashed fails the request in one line naming its log."""
        code = self.proc.poll()
        if code is None:
            return None
        how = f"signal {-code}" if code < 0 else f"code {code}"
        return ServerError(f"the server at {self.url} exited ({how}); read its log: {self.log}", "see the log")


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any smol-moe patch gate, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPEEDTRAP_SMOLMOE_")}
    return {**env, "OMP_NUM_THREADS": str(THREADS), **extra}


def start_server(argv: list[str], port: int, log: Path, env: dict[str, str] | None = None) -> Server:
    """Start a server process, wait until ``/v1/models`` answers; its output goes to ``log``."""
    full_env = env if env is not None else clean_env()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=full_env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/v1/models", timeout=2.0).status_code == 200:
                return Server(url, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"server did not answer within {SERVER_START_TIMEOUT:g} s: {log.read_text()[-2000:]}")


def stop_server(server: Server) -> None:
    server.proc.terminate()
    try:
        server.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


def serve_argv(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", str(port),
            "--threads", str(THREADS), *extra]  # fmt: skip


SIGMA = 0.5  # Gaussian noise on every logit of every forward: the noisy stack's batch-to-batch variation


@contextmanager
def noisy(model: InProcessModel, sigma: float, seed: int = 0) -> Iterator[None]:
    """Every forward of the real model gets fresh Gaussian noise on its logits (like split-K reductions,
    larger), until the block ends."""
    gen = torch.Generator().manual_seed(seed)

    def hook(_module: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(output.shape, generator=gen, dtype=torch.float32).to(output.dtype)
        return output + sigma * noise

    handle = model.model.lm_head.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()
