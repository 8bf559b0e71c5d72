"""Live localize on the real prefill/decode-disaggregated vLLM (examples/vllm-pd): the prefill-only culprit is
localized in the prefill role, inside its worker; one stack alive at a time.

Ground truth by construction: ``prefill_mlp_scale@prefill`` switches the example plugin's MLP x1.5 in layers 1-4
(passes of more than 64 tokens) on the prefill server only. The base stack is launched and captured, stopped,
then the culprit's; every model role is captured (the agent loads as a vLLM general plugin in each). The result
shown is the prefill's, and its first divergent module is layer 1's MLP; nothing diverges before it. The model is
dense (no ``routed_scaling_factor``): the scale check says so in a note instead of failing the localize. A
watcher counts vLLM API servers the whole time: at most two (one stack).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from speedtrap.localize import localize_manifest
from speedtrap.manifest import load_manifest

sys.path.insert(0, str(Path(__file__).parent))
import vllm_stack

from _watch import ServerWatcher, argv_has, marked

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "vllm-pd" / "speedtrap.toml"
MARKER = "SPEEDTRAP_TEST_STACK"
CULPRIT = "prefill_mlp_scale@prefill"


@pytest.mark.timeout(1800)
def test_the_prefill_only_culprit_is_localized_in_the_prefill_role(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vllm_stack.ensure_stack()
    monkeypatch.setenv(MARKER, tmp_path.name)
    watcher = ServerWatcher(argv_has(b"vllm.entrypoints.openai.api_server"), marked(MARKER, tmp_path.name))
    with watcher:
        [live] = localize_manifest(load_manifest(EXAMPLE), [(CULPRIT,)], tmp_path / "live", tokens=96, decode=2)
    assert watcher.most <= 2, watcher.most  # prefill and decode of one stack, never two stacks
    assert live.launches == 2 and live.role == "prefill" and set(live.roles) == {"prefill", "decode"}
    prefill = live.roles["prefill"]
    assert prefill.mechanism == "agent" and prefill.scale is None
    first = prefill.layers.first_divergent
    assert first is not None and first.startswith("model.layers.1.mlp"), first
    before = [m for m in prefill.layers.modules if m.layer == 0 and m.rel_diff is not None]
    assert before and all(m.rel_diff <= prefill.layers.threshold for m in before)
    assert any("routed_scaling_factor" in n for n in live.notes), live.notes
    print("live localize, vLLM PD:", live.extra())
