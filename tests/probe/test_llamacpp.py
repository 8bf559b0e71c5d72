"""A real peer no one here wrote: llama.cpp's OpenAI-compatible server (llama-cpp-python) on the same GGUF."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from probe_helpers import LLAMA_GRID, THREADS, Server, free_port, start_server, stop_server

from speedtrap._errors import ProbeError, ServerError
from speedtrap.probe import HttpBackend, RecallSettings, run_recall
from speedtrap.probe._http import plain_text
from speedtrap.targets.smolmoe.weights import default_gguf_path

pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] is in the dev extras")

N_CTX = 2048
TEXT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Tell me something about gardening."},
    {
        "role": "assistant",
        "content": "Gardening is a relaxing hobby. Tomatoes need plenty of sun, regular watering and a stake "
        "to climb. Basil grows well beside them and keeps some pests away.",
    },
]


def llama_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "llama_cpp.server", "--model", str(default_gguf_path()), "--host", "127.0.0.1",
            "--port", str(port), "--n_ctx", str(N_CTX), "--n_threads", str(THREADS),
            "--n_threads_batch", str(THREADS), "--verbose", "False"]  # fmt: skip


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    server = start_server(llama_argv(port), port, tmp_path_factory.mktemp("llama") / "llama.log")
    yield server
    stop_server(server)


def test_a_crashing_llama_cpp_fails_at_once_naming_its_log(tmp_path: Path) -> None:
    """A peer that dies mid-run (llama.cpp's segfault on some CPUs) is one line naming the log, not retries."""
    port = free_port()
    server = start_server(llama_argv(port), port, tmp_path / "llama.log")
    try:
        backend = HttpBackend(server.url, watch=server.died)
        asyncio.run(backend.connect())
        os.kill(server.proc.pid, signal.SIGSEGV)  # the crash, delivered: a general protection fault is a SIGSEGV
        server.proc.wait(30)
        t0 = time.monotonic()
        with pytest.raises(ServerError) as info:
            asyncio.run(backend.prompt_logprobs("user: hello", 5))
        waited = time.monotonic() - t0
    finally:
        stop_server(server)
    line = info.value.one_line()
    assert "signal 11" in line and str(tmp_path / "llama.log") in line and "\n" not in line
    assert waited < 2.0, waited  # the first retry's pause (0.5 s), not five attempts (about 8 s)


@pytest.mark.slow
def test_recall_runs_unchanged_against_llama_cpp(llama: Server) -> None:
    backend = HttpBackend(llama.url, watch=llama.died)  # model "": the one it serves
    report = run_recall(backend, LLAMA_GRID, progress=False)
    assert report.overall.n == 2
    assert report.overall.accuracy >= 0.5, report.answers()  # anchors.md: 8/8 up to 689 tokens
    assert all(100 < s.prompt_tokens <= max(LLAMA_GRID.lengths) for s in report.samples)


def test_llama_cpp_echo_logprobs_are_shifted_and_realigned(llama: Server) -> None:
    """llama-cpp-python returns echo entry i as the distribution *after* token i; the parser detects it.

    Ground truth comes from another endpoint: the logprobs of one greedily generated token (whose
    alignment is checked: a greedy token is its own step's argmax) are the distribution after the
    prompt, which must equal the echoed distribution of the next position under the detected alignment.
    """
    backend = HttpBackend(llama.url, watch=llama.died)
    text = plain_text(TEXT)
    echo = asyncio.run(backend.prompt_logprobs(text, 10))
    assert echo.shift == 1 and echo.source == "openai-echo"
    # cut the prompt at a word start, so the prefix text tokenizes to the same tokens
    cut = next(j for j in range(len(echo.tokens) - 2, 10, -1) if echo.tokens[j].startswith(" "))
    prefix = "".join(echo.tokens[:cut])
    step = asyncio.run(backend.decode_logprobs(prefix, 1, 10))[0]
    aligned = echo.positions[cut]
    assert aligned is not None
    assert aligned.argmax() == step.argmax()
    shared = [t for t in step.top if t in aligned.top][:5]
    assert len(shared) >= 3
    assert all(abs(aligned.top[t] - step.top[t]) < 0.05 for t in shared)
    # the raw reading (entry i predicts token i, as OpenAI documents) would be a different distribution
    raw = echo.positions[cut + 1]
    assert raw is not None and raw.top != aligned.top


def test_a_prompt_longer_than_llama_cpp_context_fails_loudly(llama: Server) -> None:
    settings = RecallSettings(lengths=(3 * N_CTX,), depths=(0.5,), samples=1)  # the first guess is too long
    with pytest.raises(ProbeError, match="context"):
        run_recall(HttpBackend(llama.url, retries=0, watch=llama.died), settings, progress=False)
