"""Isolate on smol-moe: in-process against brute force, the constructed pair, and per-launch servers.

The oracle is the divergence probe on short sequences (64 tokens, the last 8 fed through the KV cache
one by one, so decode-only patches are seen): about 1.5 s of CPU per configuration with one thread.
Every configuration is measured once per module (a memo around the real probe), so the brute force
and the searches share measurements; the searches still go through their own store and gate.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from speedtrap.isolate import (
    InProcessOracle,
    InteractionKind,
    Measurement,
    Outcome,
    Status,
    ThresholdRule,
    TrialRequest,
    isolate,
    manifest_for_target,
)
from speedtrap.manifest import ProbeSpec, VerdictSpec, load_manifest
from speedtrap.stack import TargetSpec
from speedtrap.targets._base import InProcessModel
from speedtrap.targets.smolmoe import SmolMoETarget
from speedtrap.targets.smolmoe.weights import default_gguf_path

SETTINGS = {"lengths": [64], "decode_tokens": 8, "bucket_size": 64}
PROBE = ProbeSpec("divergence", None, SETTINGS)
# Broken = the worst phase's p99 KL above 0.1 nats (measured: the double application ~4, bf16 lm_head ~0.002).
LOOSE = VerdictSpec(metric="worst.kl_p99", bound=0.1, near=0.25, repeats=0)
# Strict, decode only: fp8 KV cache (~0.004) fails, bf16 lm_head (~0.0003) passes.
STRICT = VerdictSpec(metric="decode.kl_p99", bound=0.002, near=0.25, repeats=1)
EIGHT = [i.name for i in SmolMoETarget().patch_infos()]
PAIR = ("combine_without_routed_scaling", "hash_topk_routed_scaling")


class MemoOracle:
    """The real in-process probe, each configuration measured once per module (same identity)."""

    def __init__(self, inner: InProcessOracle) -> None:
        self.inner = inner
        self.memo: dict[tuple[tuple[str, ...], int], Measurement] = {}

    def identity(self) -> dict[str, object]:
        return self.inner.identity()

    def measure(self, request: TrialRequest, attempt: int) -> Measurement:
        key = (tuple(sorted(request.config)), request.repeat)
        if key not in self.memo:
            self.memo[key] = self.inner.measure(request, attempt)
        return self.memo[key]

    def figures(self, config: tuple[str, ...]) -> dict[str, float]:
        return self.measure(TrialRequest(config, 0, None, "direct"), 1).figures

    def close(self) -> None:
        pass


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Two torch threads on this busy two-core machine run 20x slower than one; restore afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def oracle(smol: InProcessModel) -> MemoOracle:
    return MemoOracle(InProcessOracle(smol, TargetSpec(name="smol-moe"), PROBE))


def _fails(rule: ThresholdRule, figures: dict[str, float]) -> bool:
    outcome = rule.judge(rule.pool([figures]), None)
    assert outcome is not Outcome.NEAR, f"{rule.metric}={figures[rule.metric]} is too close to the bound to test"
    return outcome is Outcome.FAIL


def _in_process(smol: InProcessModel, oracle: MemoOracle, names: list[str], verdict: VerdictSpec, run: Path) -> Any:
    manifest = manifest_for_target("smol-moe", names, probe=PROBE, verdict=verdict)
    return isolate(manifest, run, model=smol, oracle=oracle)


def test_bisect_equals_brute_force_over_every_single_and_pair(
    smol: InProcessModel, oracle: MemoOracle, tmp_path: Path
) -> None:
    rule = ThresholdRule(LOOSE.metric, LOOSE.bound, LOOSE.direction, LOOSE.near)
    assert not _fails(rule, oracle.figures(()))
    single = {p: _fails(rule, oracle.figures((p,))) for p in EIGHT}
    pair = {frozenset(c): _fails(rule, oracle.figures(c)) for c in itertools.combinations(EIGHT, 2)}
    assert len(single) + len(pair) == 36  # + the baseline: 37 probe runs
    culprits = {frozenset({p}) for p, bad in single.items() if bad}
    joint = {s for s, bad in pair.items() if bad and not any(single[p] for p in s)}
    masked = {s for s, bad in pair.items() if not bad and any(single[p] for p in s)}
    assert culprits == {frozenset({"hash_topk_routed_scaling"})} and not joint and not masked

    result = _in_process(smol, oracle, EIGHT, LOOSE, tmp_path / "run")
    assert result.status is Status.FOUND
    assert {frozenset(c.patches) for c in result.culprits} == culprits | joint
    assert result.culprit_names == [("hash_topk_routed_scaling",)] and not result.interactions
    # Every verdict the search gave agrees with the brute force where they overlap.
    for j in result.judgements:
        if len(j.config) == 1:
            assert (j.verdict.value == "fail") == single[j.config[0]]
        elif len(j.config) == 2:
            assert (j.verdict.value == "fail") == pair[frozenset(j.config)]
    assert result.launches == len(result.trials) < 37


def test_the_constructed_pair_is_an_interaction_not_two_culprits(
    smol: InProcessModel, oracle: MemoOracle, tmp_path: Path
) -> None:
    names = [
        "mhc_bf16_gemm",
        "hash_topk_routed_scaling",
        "fp8_kv_cache",
        "lm_head_bf16",
        "combine_without_routed_scaling",
    ]
    rule = ThresholdRule(STRICT.metric, STRICT.bound, STRICT.direction, STRICT.near)
    # Ground truth, measured directly: each half of the pair breaks decoding alone, together they are right.
    assert _fails(rule, oracle.figures(("hash_topk_routed_scaling",)))
    assert _fails(rule, oracle.figures(("combine_without_routed_scaling",)))
    assert not _fails(rule, oracle.figures(PAIR))
    assert _fails(rule, oracle.figures(("fp8_kv_cache",)))
    assert not _fails(rule, oracle.figures(("lm_head_bf16",))) and not _fails(rule, oracle.figures(("mhc_bf16_gemm",)))

    result = _in_process(smol, oracle, names, STRICT, tmp_path / "run")
    assert result.status is Status.FOUND
    assert result.culprit_names == [("fp8_kv_cache",)]  # not the two halves of the pair
    (interaction,) = result.interactions
    assert interaction.kind in (InteractionKind.CANCEL, InteractionKind.MASKED) and interaction.patches == PAIR
    assert "correct only together" in interaction.explanation


def _serve_manifest(tmp_path: Path) -> Path:
    patches = []
    for info in SmolMoETarget().patch_infos():
        if info.gate.kind.value == "env":
            switch = f'env = {{ {info.gate.key} = "1" }}'
        else:  # config-gated: `speedtrap serve --set key=true`
            switch = f'config = {{ {info.gate.key} = "true" }}'
        patches.append(f'[[patches]]\nname = "{info.name}"\n{switch}\n')
    text = f"""
[target]
launch = ["{sys.executable}", "-m", "speedtrap", "serve", "--target", "smol-moe", "--port", "{{port}}",
          "--threads", "1"]
health = "http://127.0.0.1:{{port}}/health"
start_timeout = 300
config_args = ["--set", "{{key}}={{value}}"]
retries = 1

{"".join(patches)}
[probe]
kind = "divergence"
preset = "default"
settings = {{ lengths = [64], decode_tokens = 8, bucket_size = 64 }}

[verdict]
metric = "worst.kl_p99"
bound = 0.1
repeats = 0
"""
    path = tmp_path / "speedtrap.toml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_the_same_search_through_speedtrap_serve_relaunched_per_configuration(
    smol: InProcessModel, oracle: MemoOracle, tmp_path: Path
) -> None:
    manifest = load_manifest(_serve_manifest(tmp_path))
    assert [p.name for p in manifest.patches] == EIGHT
    served = isolate(manifest, tmp_path / "serve-run")
    in_process = _in_process(smol, oracle, EIGHT, LOOSE, tmp_path / "in-process-run")
    assert served.status is Status.FOUND
    assert served.culprit_names == in_process.culprit_names == [("hash_topk_routed_scaling",)]
    assert served.interactions == in_process.interactions == ()
    for trial in served.trials:
        log = Path(str(trial.log_path)).read_text()
        # Each server switched on exactly the trial's patches (it prints them as it starts).
        assert f"patches on: {', '.join(p for p in EIGHT if p in trial.config) or 'none'}" in log


@pytest.mark.slow
def test_a_llama_cpp_manifest_whose_patches_are_launch_flags_gives_an_honest_verdict(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp.server")
    text = f"""
[target]
launch = ["{sys.executable}", "-m", "llama_cpp.server", "--model", "{{model}}", "--host", "127.0.0.1",
          "--port", "{{port}}", "--n_ctx", "1024", "--n_threads", "1", "--n_threads_batch", "1", "--verbose", "False"]
model = "{default_gguf_path()}"
health = "http://127.0.0.1:{{port}}/v1/models"
start_timeout = 120

[[patches]]
name = "flash_attn"
args = ["--flash_attn", "true"]

[[patches]]
name = "q8_0_kv_cache"
args = ["--type_k", "8", "--type_v", "8"]
requires = ["flash_attn"]   # a quantized V cache needs flash attention

[[patches]]
name = "q4_0_kv_cache"
args = ["--type_k", "2", "--type_v", "2"]
requires = ["flash_attn"]
conflicts = ["q8_0_kv_cache"]

[probe]
kind = "divergence"
preset = "default"
settings = {{ lengths = [64], decode_tokens = 4, bucket_size = 64 }}

[verdict]
metric = "worst.kl_p99"
bound = 0.5
repeats = 1
"""
    path = tmp_path / "llama.toml"
    path.write_text(text)
    result = isolate(load_manifest(path), tmp_path / "run")
    assert result.not_searched == {"q4_0_kv_cache": "conflicts with q8_0_kv_cache, which is searched instead"}
    full = next(j for j in result.judgements if set(j.config) == {"flash_attn", "q8_0_kv_cache"})
    value = full.figures["worst.kl_p99"]
    # Honest: the verdict follows the measurement, whatever it is.
    if result.status is Status.FULL_PASSES:
        assert value < 0.5 * 1.25 and "does not fail" in result.message
    else:
        assert result.status in (Status.FOUND, Status.INCONCLUSIVE) and value > 0.5 * 0.75
    first_full = next(t for t in result.trials if set(t.config) == {"flash_attn", "q8_0_kv_cache"})
    argv = Path(str(first_full.log_path)).read_text().splitlines()[0]
    assert "--flash_attn true" in argv and "--type_k 8 --type_v 8" in argv and "--type_k 2" not in argv
