"""``speedtrap serve`` over real HTTP: the probes get the in-process answers and logprobs; its errors."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from probe_helpers import HTTP_GRID, Server, clean_env, free_port, serve_argv, start_server, stop_server

from speedtrap._errors import ProbeError
from speedtrap.probe import (
    DivergenceSettings,
    HttpBackend,
    InProcessBackend,
    RecallReport,
    run_divergence,
    run_recall,
)
from speedtrap.targets._base import InProcessModel

TEXT = [
    {"role": "user", "content": "Tell me something about lighthouses."},
    {"role": "assistant", "content": "Lighthouses guide ships along dangerous coasts with a bright light at night."},
]


def test_served_recall_gives_the_in_process_answers(served: Server, http_grid_inprocess: RecallReport) -> None:
    report = run_recall(HttpBackend(served.url, "smol-moe", concurrency=4), HTTP_GRID, progress=False)
    assert report.answers() == http_grid_inprocess.answers()
    assert [s.prompt_tokens for s in report.samples] == [s.prompt_tokens for s in http_grid_inprocess.samples]
    assert report.overall == http_grid_inprocess.overall


def test_serve_endpoints(served: Server, smol: InProcessModel) -> None:
    health = httpx.get(served.url + "/health").json()
    assert health["patches"] == [] and health["status"] == "ok"
    cards = httpx.get(served.url + "/v1/models").json()["data"]
    assert cards[0]["id"] == "smol-moe" and cards[0]["max_model_len"] == 8192
    tok = httpx.post(served.url + "/tokenize", json={"messages": TEXT, "add_generation_prompt": False}).json()
    assert tok["tokens"] == smol.chat_ids(TEXT, add_generation_prompt=False)
    wrong = httpx.post(served.url + "/v1/chat/completions", json={"model": "gpt-4", "messages": TEXT})
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
    bad = httpx.post(served.url + "/v1/completions", json={"prompt": {"not": "a prompt"}})
    assert bad.status_code == 422


def test_prompt_logprobs_match_in_process_in_every_dialect(served: Server, smol: InProcessModel) -> None:
    ids = smol.chat_ids(TEXT, add_generation_prompt=False)

    async def fetch() -> list[object]:
        backends = [HttpBackend(served.url, "smol-moe", api=api) for api in ("openai", "vllm", "sglang")]
        return [await b.prompt_logprobs(ids, 5) for b in backends]

    exact = asyncio.run(InProcessBackend(smol).prompt_logprobs(ids, 5))
    for got in asyncio.run(fetch()):
        assert got.shift == 0 and got.tokens == exact.tokens, got.source  # type: ignore[attr-defined]
        for mine, theirs in zip(exact.positions[1:], got.positions[1:], strict=True):  # type: ignore[attr-defined]
            assert mine is not None and theirs is not None
            assert theirs.logprob == pytest.approx(mine.logprob, abs=1e-4)
            assert theirs.argmax() == mine.argmax()


def test_decode_logprobs_match_in_process(served: Server, smol: InProcessModel) -> None:
    ids = smol.chat_ids(TEXT[:1])
    exact = asyncio.run(InProcessBackend(smol).decode_logprobs(ids, 6, 3))
    got = asyncio.run(HttpBackend(served.url, "smol-moe").decode_logprobs(ids, 6, 3))
    assert [s.token for s in got] == [s.token for s in exact]
    assert all(math.isclose(a.logprob or 0, b.logprob or 0, abs_tol=1e-4) for a, b in zip(got, exact, strict=True))


def test_prompts_the_server_cannot_hold_fail_loudly(served: Server) -> None:
    backend = HttpBackend(served.url, "smol-moe")
    with pytest.raises(ProbeError, match="longer than the server's context"):
        asyncio.run(backend.prompt_logprobs([100] * 8300, 5))  # the server's own check, HTTP 400
    long_chat = [{"role": "user", "content": "word " * 9000}]
    with pytest.raises(ProbeError, match="does not fit the server's context of 8192"):
        asyncio.run(backend.chat(long_chat, 16))  # counted with /tokenize before sending


def test_cli_recall_over_http_writes_results_and_json(served: Server, tmp_path: Path) -> None:
    results = tmp_path / "r.jsonl"
    argv = [sys.executable, "-m", "speedtrap", "probe", "recall", "--target", served.url, "--lengths", "200",
            "--depths", "0.5", "--samples", "1", "--results", str(results), "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    report = RecallReport.from_json(json.loads(done.stdout))
    assert report.overall.n == 1 and report.backend == f"{served.url}[smol-moe]"
    assert len(results.read_text().splitlines()) == 2


@pytest.mark.slow
def test_gates_at_launch_and_divergence_over_http(served: Server, tmp_path: Path) -> None:
    """A second server launched with an env gate and a config-gated patch: startup line, /health, divergence."""
    port = free_port()
    argv = serve_argv(port, "--set", "apply_routed_scaling_factor_on_output=true")
    patched = start_server(argv, port, tmp_path / "patched.log", clean_env(SPEEDTRAP_SMOLMOE_LM_HEAD_BF16="1"))
    try:
        assert "speedtrap serve: patches on: hash_topk_routed_scaling, lm_head_bf16" in patched.log_text()
        assert httpx.get(patched.url + "/health").json()["patches"] == ["hash_topk_routed_scaling", "lm_head_bf16"]
        settings = DivergenceSettings(lengths=(256,), sequences=1, decode_tokens=8, bucket_size=128, top_k=10)
        base = HttpBackend(served.url, "smol-moe")
        same = run_divergence(base, base, settings, progress=False)
        assert same.approximation and "top-10" in same.approximation
        assert all(p.overall.kl_max == 0.0 and p.overall.same_top1 == 1.0 for p in same.phases.values())
        assert same.phases["prefill"].overall.tokens == 255
        broken = run_divergence(base, HttpBackend(patched.url, "smol-moe"), settings, progress=False)
        assert broken.phases["prefill"].overall.kl_mean > 0.1
        assert broken.phases["prefill"].overall.same_top1 < 0.9
        assert broken.phases["decode"].overall.tokens >= 1
    finally:
        stop_server(patched)


def test_cli_divergence_of_a_server_against_itself_is_zero(served: Server, tmp_path: Path) -> None:
    results = tmp_path / "d.jsonl"
    argv = [sys.executable, "-m", "speedtrap", "probe", "divergence", "--target", served.url, "--baseline",
            served.url, "--lengths", "128", "--decode-tokens", "4", "--top-k", "5", "--json",
            "--results", str(results)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert "top-5" in data["approximation"]
    assert {p: d["overall"]["kl_max"] for p, d in data["phases"].items()} == {"prefill": 0.0, "decode": 0.0}
    assert data["phases"]["prefill"]["overall"]["tokens"] == 127
    assert len(results.read_text().splitlines()) == 2  # header + the one sequence, written as it finished
    # Resuming a finished file measures nothing again and reports the same figures.
    again = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["phases"] == data["phases"]
