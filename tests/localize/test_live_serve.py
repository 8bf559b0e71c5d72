"""Live localize on a real HTTP server: ``speedtrap serve --target smol-moe`` with the in-worker agent.

Ground truth by construction: ``hash_topk_routed_scaling`` (switched on by its config key, as a
server would get it) applies ``routed_scaling_factor`` a second time in layers 0-5. The live layer
diff must name the module the in-process ``layer_diff`` names on the same ids, and the live scale
check must give the in-process exponents. One server alive at a time: base, then trial, then the
chunked-prefill trial, each stopped before the next starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from speedtrap._errors import ServerError
from speedtrap.localize import (
    Capture,
    LayerDiffResult,
    ScaleCheckResult,
    agent_env,
    capture_live,
    check_scale,
    compare_captures,
    layer_diff,
    load_capture,
    scale_live,
)
from speedtrap.stack import LaunchSpec, Server, free_port, launch
from speedtrap.targets._base import InProcessModel

PROMPT = 24
DECODE = 3
HASH = set(range(6))  # the layers hash_topk_routed_scaling patches (speedtrap patches --target smol-moe)
SCALED = ("--set", "apply_routed_scaling_factor_on_output=true")  # the patch's gate: a config key
EXPONENT_TOLERANCE = 1e-6  # live and in-process run the same float32 kernels on the same inputs


@dataclass
class Live:
    folder: Path
    base: Capture
    trial: Capture
    chunked: Capture
    scale_base: ScaleCheckResult
    scale_trial: ScaleCheckResult
    alive: list[int]  # servers alive when each one started (the guard: one at a time)


def _serve(tmp: Path, name: str, *args: str, **env: str) -> tuple[Server, Path, str]:
    port = free_port()
    folder = tmp / f"agent-{name}"
    full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    full |= agent_env(folder, full)
    argv = (sys.executable, "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", str(port), *args)
    spec = LaunchSpec(argv, full, f"http://127.0.0.1:{port}/health", start_timeout=180)
    return launch(spec, tmp / f"{name}.log", port), folder, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, smol_ids: list[int]) -> Iterator[Live]:
    from speedtrap.stack._launch import _LIVE

    tmp = tmp_path_factory.mktemp("live")
    ids = smol_ids[:PROMPT]
    alive = []
    server, folder, url = _serve(tmp, "base")
    alive.append(len(_LIVE))
    with server:
        base = capture_live(url, folder, ids, api="openai", out=tmp / "base.capture", decode=DECODE, repeat=True)
        scale_base = scale_live(url, folder, ids, api="openai", role="base")
    server, folder, url = _serve(tmp, "trial", *SCALED)
    alive.append(len(_LIVE))
    with server:
        label = ("hash_topk_routed_scaling",)
        out = tmp / "trial.capture"
        trial = capture_live(url, folder, ids, api="openai", out=out, decode=DECODE, role="trial", label=label)
        scale_trial = scale_live(url, folder, ids, api="openai", label=label)
    server, folder, url = _serve(tmp, "chunked", SPEEDTRAP_SMOLMOE_CHUNKED_PREFILL="1")
    alive.append(len(_LIVE))
    with server:
        chunked = capture_live(url, folder, ids, api="openai", out=tmp / "chunked.capture", decode=DECODE, role="trial")
    yield Live(tmp, base, trial, chunked, scale_base, scale_trial, alive)


def test_one_server_at_a_time(live: Live) -> None:
    assert live.alive == [1, 1, 1]


def test_live_layer_diff_names_the_in_process_first_divergent_module(
    live: Live, smol: InProcessModel, smol_ids: list[int]
) -> None:
    base = load_capture(live.folder / "base.capture", "base")
    result = compare_captures(base, load_capture(live.folder / "trial.capture", "trial"))
    in_process = layer_diff(smol, ["hash_topk_routed_scaling"], smol_ids[:PROMPT])
    assert result.first_divergent == in_process.first_divergent == "layers.0.mlp.gate"
    assert isinstance(result, LayerDiffResult) and result.patches == ("hash_topk_routed_scaling",)
    # The patched router's first decode token differs: only the prompt's positions are comparable.
    assert result.tokens == PROMPT and result.decode_tokens == 0
    live_gate = result.module("layers.0.mlp.gate").rel_diff
    assert live_gate == pytest.approx(in_process.module("layers.0.mlp.gate").rel_diff, rel=1e-5)
    assert {g.layer for g in result.growth} == set(range(30))


def test_the_base_repeat_measures_noise_and_the_capture_records_its_bytes(live: Live) -> None:
    noise = live.base.noise
    assert noise is not None and noise.rel_diff == 0.0  # speedtrap serve on CPU: the same bits twice
    assert noise.positions == PROMPT + DECODE  # prompt plus the decode steps, all fed alike
    assert live.base.forwards == 1 + DECODE and live.base.raw_bytes > 0
    assert live.base.extra["bytes"] == (live.folder / "base.capture").stat().st_size


def test_chunked_prefill_is_compared_row_by_row_and_does_not_diverge(live: Live) -> None:
    result = compare_captures(live.base, live.chunked)
    assert result.first_divergent is None
    assert result.tokens == PROMPT + DECODE and result.decode_tokens == DECODE
    compared = {m.name for m in result.modules if m.status == "compared"}
    assert {"layers.0.mlp.gate", "layers.29.mlp", "lm_head"} <= compared


def test_live_scale_check_gives_two_in_the_patched_layers_and_agrees_with_in_process(
    live: Live, smol: InProcessModel, smol_ids: list[int]
) -> None:
    ids = smol_ids[:PROMPT]
    assert live.scale_base.times_by_layer() == {i: 1 for i in range(30)}
    assert live.scale_trial.times_by_layer() == {i: (2 if i in HASH else 1) for i in range(30)}
    for live_result, patches in ((live.scale_base, []), (live.scale_trial, ["hash_topk_routed_scaling"])):
        in_process = check_scale(smol, ids, patches=patches)
        assert [u.module for u in live_result.units] == [u.module for u in in_process.units]
        for a, b in zip(live_result.units, in_process.units, strict=True):
            assert a.exponent == pytest.approx(b.exponent, abs=EXPONENT_TOLERANCE)
            assert a.measured == b.measured and a.verdict == b.verdict
            assert [c.module for c in a.consumers] == [c.module for c in b.consumers]
            for ca, cb in zip(a.consumers, b.consumers, strict=True):
                assert ca.exponent == pytest.approx(cb.exponent, abs=EXPONENT_TOLERANCE)
            # Where: the same sites recorded inside the server's worker as in this process (same code, same lines).
            assert [(s.file, s.line, s.kind, s.applies) for s in a.applying] == [
                (s.file, s.line, s.kind, s.applies) for s in b.applying
            ]
            assert sum(s.applies for s in a.applying) == a.times
        assert live_result.provenance is not None and live_result.provenance["bytes"] > 0


def test_a_missing_or_corrupt_capture_is_an_error_naming_role_and_file(live: Live, tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=r"the trial capture file .*nothing\.capture is missing"):
        load_capture(tmp_path / "nothing.capture", "trial")
    corrupt = tmp_path / "corrupt.capture"
    corrupt.write_bytes((live.folder / "trial.capture").read_bytes()[:5000])
    with pytest.raises(ServerError, match=r"the prefill capture file .*corrupt\.capture is unreadable"):
        load_capture(corrupt, "prefill")
