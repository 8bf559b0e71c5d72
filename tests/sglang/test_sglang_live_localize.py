"""Live localize on real SGLang 0.5.23 (CPU): the seed's commit ``glm4_fused_topk_scale``, measured in the engine.

The example is built in a temporary folder from ``examples/sglang/build_example.py``'s functions (the model
exported as GLM-4.5's MoE layout, SGLang's package as a git repository with the commits). Two servers, one
alive at a time, each launched with SGLang's dumper ready (``dumper_env``) and speedtrap's agent
(``agent_env``): the base package, then the seed's commit from a worktree. Per server: the layer capture
through SGLang's own dumper (the base's repeated once for the noise figure) and the scale check through
the agent. Ground truth by construction: the commit makes the top-k apply ``routed_scaling_factor`` while
the block still multiplies by it, so the routed output goes as the factor squared in every MoE layer.

The in-process side: ``hf:<the exported folder>`` (transformers' Glm4MoeForCausalLM) gives the base's
exponents; its equivalent of the commit is ``speedtrap.localize.examples:apply_factor_again`` (the
experts' output multiplied by the factor once more), which must give the commit's exponents.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sglang_stack import ROOT, START_TIMEOUT, ensure_python, sglang_argv, sglang_env

from speedtrap.localize import agent_env, capture_live, check_scale, compare_captures, dumper_env, scale_live
from speedtrap.localize._results import layer_of
from speedtrap.stack import LaunchSpec, Server, free_port, launch

pytestmark = pytest.mark.slow

sys.path.insert(0, str(ROOT / "examples" / "sglang"))
import build_example  # noqa: E402

IDS = [(i * 7919) % 20000 + 100 for i in range(32)]
DECODE = 3
EXPONENT_TOLERANCE = 0.01  # live (SGLang's kernels) vs in-process (transformers'), both float32


def _launch(python: Path, model: Path, tmp: Path, name: str, source: Path | None) -> tuple[Server, Path, Path]:
    port = free_port()
    agent, dump = tmp / f"agent-{name}", tmp / f"dump-{name}"
    env = sglang_env() | dumper_env(dump)
    env |= agent_env(agent, {"PYTHONPATH": str(source)} if source else {})
    argv = tuple(sglang_argv(python, model, port))
    spec = LaunchSpec(argv, env, f"http://127.0.0.1:{port}/health", START_TIMEOUT, 30.0, cwd=source)
    return launch(spec, tmp / f"{name}.log", port), agent, dump


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python = ensure_python()  # the venv only: nothing is written into the clone
    tmp = tmp_path_factory.mktemp("sglang-live")
    model = build_example.export_model(tmp / "model")
    repo = tmp / "sglang-src"
    shas = build_example.build_repo(python, repo)
    seed = tmp / "seed"
    build_example.git("worktree", "add", "-q", "--detach", str(seed), shas["glm4_fused_topk_scale"], repo=repo)
    out: dict[str, Any] = {"model": model, "tmp": tmp}
    try:
        for name, source in (("base", None), ("seed", seed)):
            server, agent, dump = _launch(python, model, tmp, name, source)
            with server:
                url = f"http://127.0.0.1:{server.port}"
                t0 = time.monotonic()
                capture = capture_live(
                    url, dump, IDS, api="sglang", out=tmp / f"{name}.capture", decode=DECODE, role=name,
                    stack="sglang", label=() if source is None else ("glm4_fused_topk_scale",),
                    repeat=source is None, mechanism="sglang-dumper",
                )  # fmt: skip
                t1 = time.monotonic()
                scale = scale_live(url, agent, IDS, api="sglang", role=name)
                t2 = time.monotonic()
            out[name] = {"capture": capture, "scale": scale, "capture_s": t1 - t0, "scale_s": t2 - t1}
        yield out
    finally:
        build_example.git("worktree", "remove", "--force", str(seed), repo=repo)
        figures = {
            n: {"capture_s": round(out[n]["capture_s"], 1), "scale_s": round(out[n]["scale_s"], 1),
                "raw_bytes": out[n]["capture"].raw_bytes, "capture_bytes": out[n]["capture"].extra.get("bytes")}
            for n in ("base", "seed") if n in out
        }  # fmt: skip
        print("live localize figures:", json.dumps(figures))


def _moe_layers(model: Path) -> set[int]:
    config = json.loads((model / "config.json").read_text())
    return set(range(int(config.get("first_k_dense_replace", 0)), int(config["num_hidden_layers"])))


def test_the_dumper_capture_names_a_module_inside_the_first_moe_layers_mlp(measured: dict[str, Any]) -> None:
    base, seed = measured["base"]["capture"], measured["seed"]["capture"]
    assert base.noise is not None and base.noise.positions >= len(IDS)  # the repeat was computed again (cache flushed)
    result = compare_captures(base, seed, target="sglang")
    first_moe = min(_moe_layers(measured["model"]))
    assert result.first_divergent is not None, [(m.name, m.rel_diff) for m in result.modules[:20]]
    assert result.first_divergent.startswith(f"model.layers.{first_moe}.mlp"), result.first_divergent
    assert all(m.layer is None or m.layer >= first_moe for m in result.over_threshold())
    print("first divergent:", result.first_divergent, "noise:", base.noise, "threshold:", result.threshold)


def test_the_agents_scale_check_says_twice_with_the_commit_and_once_without(measured: dict[str, Any]) -> None:
    moe = _moe_layers(measured["model"])
    base, seed = measured["base"]["scale"], measured["seed"]["scale"]
    assert {u.layer for u in base.units} == moe == {u.layer for u in seed.units}
    for unit in base.units:
        assert unit.times == 1 and unit.exponent == pytest.approx(1.0, abs=EXPONENT_TOLERANCE), unit
    for unit in seed.units:
        assert unit.times == 2 and unit.exponent == pytest.approx(2.0, abs=EXPONENT_TOLERANCE), unit
    print("base exponents:", [round(u.exponent or 0, 4) for u in base.units])
    print("seed exponents:", [round(u.exponent or 0, 4) for u in seed.units])
    print("seed consumers of the first unit:", [(c.module, c.exponent) for c in seed.units[0].consumers])


def test_in_process_hf_on_the_same_folder_gives_the_same_exponents(measured: dict[str, Any]) -> None:
    from speedtrap.targets import load_target

    again = "speedtrap.localize.examples:apply_factor_again"  # the in-process equivalent of the commit
    model = load_target(f"hf:{measured['model']}", patches=[again])
    for live, patches in ((measured["base"]["scale"], []), (measured["seed"]["scale"], [again])):
        in_process = check_scale(model, IDS, patches=patches)
        # speedtrap's hf: target holds transformers' model as its child ``hf``: the same names below it
        assert [u.module.removeprefix("hf.") for u in in_process.units] == [u.module for u in live.units]
        for a, b in zip(live.units, in_process.units, strict=True):
            assert a.times == b.times and layer_of(a.module) == b.layer
            assert a.exponent == pytest.approx(b.exponent, abs=EXPONENT_TOLERANCE)
