"""Cross-engine divergence on real servers: ``speedtrap serve --dialect sglang`` (SGLang 0.5.23's answers,
flags it lacks dropped) against an in-process reference of the same weights.

Tolerance: both sides run the same float32 code on the same weights, so the figures are measured at
rounding level (README, "Cross-engine"); the bound asserted is ``KL_TOL``, far below any patch's
effect (the smallest, ``rope_cache_bf16``, is above 1e-4 nats at p99).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from probe_helpers import Server, free_port, serve_argv, start_server, stop_server

from speedtrap._errors import ProbeError
from speedtrap.probe import DivergenceSettings, HttpBackend, InProcessBackend, run_divergence
from speedtrap.targets._base import InProcessModel

KL_TOL = 1e-6  # nats; measured figures are ~1e-9 or below (README)
SETTINGS = DivergenceSettings(lengths=(64,), sequences=1, decode_tokens=8, bucket_size=64, top_k=5)


@pytest.fixture(scope="module")
def sglang_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log = tmp_path_factory.mktemp("sglang") / "serve.log"
    # a context below the tokenizer's model_max_length (8,192), as a deployment may set it
    server = start_server(serve_argv(port, "--dialect", "sglang", "--context-length", "4096"), port, log)
    yield server
    stop_server(server)


def test_sglang_dialect_answers_as_sglang_does(sglang_served: Server) -> None:
    url = sglang_served.url
    body = {"prompt": [504, 3458, 314, 260], "max_tokens": 2, "temperature": 0, "logprobs": 2,
            "return_tokens_as_token_ids": True, "prompt_logprobs": 2}  # fmt: skip
    choice = httpx.post(url + "/v1/completions", json=body).json()["choices"][0]
    assert "prompt_logprobs" not in choice  # dropped, as SGLang's CompletionRequest drops it
    assert not any(t.startswith("token_id:") for t in choice["logprobs"]["tokens"])  # text, not ids
    card = httpx.get(url + "/v1/models").json()["data"][0]
    tok = httpx.post(url + "/tokenize", json={"prompt": "hello"}).json()
    # /tokenize says the tokenizer's model_max_length; this GGUF tokenizer has none (1e30), which SGLang
    # replaces by the context (serving_tokenize.py:48-52). The client reads /v1/models' either way.
    assert (card["max_model_len"], tok["max_model_len"]) == (4096, 4096)
    client = HttpBackend(url, "smol-moe", api="sglang")
    asyncio.run(client.count_tokens([{"role": "user", "content": "hello"}]))
    assert client.context == 4096
    bad = httpx.post(url + "/v1/completions", json={"prompt": {"not": "a prompt"}})
    assert bad.status_code == 400 and bad.json()["object"] == "error" and bad.json()["code"] == 400
    assert httpx.get(url + "/version").status_code == 404
    assert httpx.get(url + "/server_info").json()["dialect"] == "sglang 0.5.23"


@pytest.mark.parametrize("api", ["openai", "sglang"])
def test_sglang_dialect_against_the_in_process_reference_is_near_zero(
    sglang_served: Server, smol: InProcessModel, api: str
) -> None:
    """openai: decode tokens come back as text (the flag is dropped) and are mapped to ids; sglang: /generate."""
    reference = InProcessBackend(smol)
    server = HttpBackend(sglang_served.url, "smol-moe", api=api)  # type: ignore[arg-type]
    report = run_divergence(reference, server, SETTINGS, progress=False)
    prefill, decode = report.phases["prefill"].overall, report.phases["decode"].overall
    # every step compared up to the end of turn (5 steps on this sequence); keyed by text against ids, the
    # comparison would stop after the first step
    assert prefill.tokens == 63 and decode.tokens == 5
    assert prefill.kl_max < KL_TOL and decode.kl_max < KL_TOL
    assert prefill.same_top1 == 1.0 and decode.same_top1 == 1.0
    assert report.keys["unmapped"] == 0
    assert (report.keys["mapped"] > 0) == (api == "openai")
    assert "sglang 0.5.23 dialect" in report.engines["candidate"] and "in-process" in report.engines["baseline"]


def test_an_id_sglang_reports_as_0_fails_with_the_reason(sglang_served: Server) -> None:
    backend = HttpBackend(sglang_served.url, "smol-moe", api="sglang")
    ids = [1, 504, 3458, 49151, 314, 260]  # 49151 = vocab_size - 1
    with pytest.raises(ProbeError, match="replaces prompt ids at or above"):
        asyncio.run(backend.prompt_logprobs(ids, 3))


@pytest.mark.slow
def test_auto_truncation_is_named_on_a_real_server(tmp_path: Path) -> None:
    port = free_port()
    argv = serve_argv(port, "--dialect", "sglang", "--context-length", "96", "--allow-auto-truncate")
    server = start_server(argv, port, tmp_path / "trunc.log")
    try:
        for api in ("sglang", "openai"):
            backend = HttpBackend(server.url, "smol-moe", api=api)  # type: ignore[arg-type]
            with pytest.raises(ProbeError, match="kept 96 of the prompt's 120 tokens"):
                asyncio.run(backend.prompt_logprobs(list(range(300, 420)), 3))
    finally:
        stop_server(server)


@pytest.mark.slow
def test_cli_server_against_transformers_reference(sglang_served: Server) -> None:
    """``--baseline hf:<gguf>``: the plain transformers model of the same GGUF file, in-process, float32."""
    from speedtrap.targets.smolmoe.weights import default_gguf_path

    argv = [sys.executable, "-m", "speedtrap", "probe", "divergence", "--target", sglang_served.url,
            "--baseline", f"hf:{default_gguf_path()}", "--lengths", "128", "--decode-tokens", "8",
            "--top-k", "5", "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads(done.stdout)
    assert data["engines"]["baseline"].startswith("in-process hf:")
    assert "sglang 0.5.23 dialect" in data["engines"]["candidate"]
    for phase in ("prefill", "decode"):
        overall = data["phases"][phase]["overall"]
        assert overall["kl_max"] < 1e-4 and overall["same_top1"] == 1.0, (phase, overall)
    assert data["phases"]["decode"]["overall"]["tokens"] == 8
