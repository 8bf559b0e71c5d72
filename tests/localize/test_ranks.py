"""Every rank: layouts, unsharding, rank-by-rank comparison and the scale check combined over expert-holding ranks.

The unit tests put a full tensor's shards back together by brute force (the full tensor is known). The
process tests run ``ep_worker.py``: a tiny MoE split over two processes (torch.distributed, gloo), each
holding half the experts and a slice of every tensor-parallel weight, with speedtrap's agent attached as
in an engine; the ground truth is the same model in one process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speedtrap.localize import Capture, ModuleRows, compare_captures, load_capture, save_capture
from speedtrap.localize._agentlink import AGENT_ENV, AGENT_PATH, AgentLink
from speedtrap.localize._capture import AgentSource, Layout, keep_prompt_rows
from speedtrap.localize._live import agent_capture, agent_scale
from speedtrap.localize._ranks import merge_ranks
from speedtrap.localize.agent.speedtrap_agent import reduce_for, reduce_rows, shard_picks

WORKER = Path(__file__).with_name("ep_worker.py")
IDS = [3, 17, 42, 5, 9, 33, 61, 2, 28, 11, 47, 19]


# -- unit: shards put back together ---------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    parts=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    world=st.integers(1, 4),
    channels=st.integers(1, 40),
)
def test_the_ranks_picks_are_the_full_sample_once_each(parts: list[int], world: int, channels: int) -> None:
    full = sum(parts) * world
    expected = list(range(full)) if full <= channels else [i * full // channels for i in range(channels)]
    picked = [g for r in range(world) for g in shard_picks(parts, world, r, channels)[0]]
    assert sorted(picked) == expected


def _shards(full: torch.Tensor, parts: list[int], world: int) -> list[torch.Tensor]:
    """The brute-force split: block ``p`` of the full tensor (``parts[p] * world`` wide), rank r's slice of each."""
    out = []
    for r in range(world):
        blocks, start = [], 0
        for p in parts:
            blocks.append(full[:, start + r * p : start + (r + 1) * p])
            start += p * world
        out.append(torch.cat(blocks, dim=1))
    return out


def _rank(name: str, rows: dict[str, torch.Tensor], layout: Layout, features: int, rank: int, world: int) -> Capture:
    n = rows["x"].shape[0]
    keys = {"pos": torch.arange(n), "ids": torch.tensor(IDS[:n]), "occ": torch.zeros(n, dtype=torch.long),
            "fwd": torch.zeros(n, dtype=torch.long)}  # fmt: skip
    module = keep_prompt_rows(name, 0, features, {**rows, **keys}, IDS[:n], layout)
    source = AgentSource("agent", 100 + rank, "test", "M")
    return Capture(source, "trial", "test", (), tuple(IDS[:n]), 0, CHANNELS, (module,), 1, rank=rank, world=world)


CHANNELS = 12


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(st.integers(1, 8), min_size=1, max_size=3), world=st.integers(2, 3), seed=st.integers(0, 99))
def test_a_sharded_output_unshards_to_the_full_tensors_rows(parts: list[int], world: int, seed: int) -> None:
    full = torch.randn(5, sum(parts) * world, generator=torch.Generator().manual_seed(seed))
    layout = Layout("sharded", tuple(parts))
    ranks = [
        _rank("m", reduce_for(s, CHANNELS, layout.to_json(), world, r), layout, sum(parts), r, world)
        for r, s in enumerate(_shards(full, parts, world))
    ]
    merged = merge_ranks(ranks).modules[0]
    truth = reduce_rows(full, CHANNELS)
    assert merged.features == full.shape[1]
    assert torch.equal(merged.rows["x"], truth["x"])
    assert torch.allclose(merged.rows["sq"], truth["sq"], rtol=1e-6)
    assert torch.equal(merged.rows["max"], truth["max"])


def test_partial_outputs_are_summed_and_replicated_ones_must_agree(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    partial = Layout("partial")
    ranks = [_rank("p", reduce_rows(t, CHANNELS), partial, 6, r, 2) for r, t in enumerate((a, b))]
    assert torch.allclose(merge_ranks(ranks).modules[0].rows["x"], a + b)
    replicated = Layout("replicated")
    same = [_rank("n", reduce_rows(a, CHANNELS), replicated, 6, r, 2) for r in range(2)]
    assert merge_ranks(same).extra["ranks"]["disagree"] == []
    off = [_rank("n", reduce_rows(t, CHANNELS), replicated, 6, r, 2) for r, t in enumerate((a, a * 1.01))]
    merged = merge_ranks(off)
    (found,) = merged.extra["ranks"]["disagree"]
    assert (found["role"], found["rank"], found["module"]) == ("trial", 1, "n")
    assert torch.equal(merged.modules[0].rows["x"], a)  # rank 0's rows, never an average
    auto = [_rank("u", reduce_rows(t, CHANNELS), Layout("auto"), 6, r, 2) for r, t in enumerate((a, b))]
    assert merge_ranks(auto).modules == () and merge_ranks(auto).extra["ranks"]["rank_local"] == ["u"]
    path = tmp_path / "m.capture"
    save_capture(merged, path)
    back = load_capture(path, "trial")
    assert back.world == 2 and [r.rank for r in back.ranks] == [0, 1]
    assert back.ranks[1].modules[0].layout == replicated and torch.equal(back.ranks[1].modules[0].rows["x"], a * 1.01)


# -- processes: a tiny MoE over two gloo ranks, the agent attached -------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ranks:
    """``world`` worker processes of ``ep_worker.py`` (one model split over them), driven through the agent."""

    def __init__(self, folder: Path, world: int, variant: str) -> None:
        self.folder = folder
        self.world = world
        folder.mkdir(parents=True)
        env = {**os.environ, "PYTHONPATH": str(AGENT_PATH), AGENT_ENV: str(folder / "agent"), "OMP_NUM_THREADS": "1"}
        port = str(_free_port())
        args = [[sys.executable, str(WORKER), str(folder), str(r), str(world), port, variant] for r in range(world)]
        self.procs = [subprocess.Popen(a, env=env, stderr=subprocess.PIPE, text=True) for a in args]
        self.link = AgentLink(folder / "agent", f"{variant} TP{world}", timeout=120)
        self.sent = 0

    def request(self, ids: list[int]) -> None:
        n, self.sent = self.sent, self.sent + 1
        (self.folder / "requests" / f"{n}.json").write_text(json.dumps({"ids": ids}))
        deadline = time.monotonic() + 120
        while not all((self.folder / "requests" / f"{n}.{r}.done").exists() for r in range(self.world)):
            dead = [p for p in self.procs if p.poll() is not None]
            assert not dead, dead[0].stderr.read() if dead[0].stderr else "a worker died"
            assert time.monotonic() < deadline, "the workers did not answer"
            time.sleep(0.02)

    def capture(self, channels: int = 8) -> Capture:
        return agent_capture(self.link, IDS, 0, lambda: self.request(IDS), stack="ep", channels=channels)

    def __enter__(self) -> Ranks:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        (self.folder / "stop").write_text("")
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Captures and scale checks of each variant at one and two ranks (started side by side)."""
    root = tmp_path_factory.mktemp("ranks")
    out: dict[str, Any] = {}
    plans = [(1, "once"), (2, "once"), (1, "twice"), (2, "twice"), (1, "half"), (2, "half"), (2, "skew"), (2, "inside")]
    combined: list[Any] = []
    import speedtrap.localize._live as live
    from speedtrap.localize._ranks import combine_scale

    def spy(per_rank: Any) -> Any:
        combined.append(per_rank)
        return combine_scale(per_rank)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(live, "combine_scale", spy)
        for world, variant in plans:
            with Ranks(root / f"{variant}{world}", world, variant) as ranks:
                started = time.monotonic()
                capture = ranks.capture()
                seconds = time.monotonic() - started
                scale = agent_scale(ranks.link, IDS, lambda r=ranks: r.request(IDS))  # type: ignore[misc]
                out[f"{variant}{world}"] = (capture, scale, combined[-1], seconds)
    yield out


def test_two_ranks_capture_unshards_to_the_single_process_capture(runs: dict[str, Any]) -> None:
    single, merged = runs["once1"][0], runs["once2"][0]
    assert merged.world == 2 and [r.rank for r in merged.ranks] == [0, 1]
    layouts = {m.name: m.layout.kind for m in merged.ranks[1].modules if m.tensor == 0}
    assert layouts["layers.0.mlp.gate_up_proj"] == "sharded" and layouts["layers.0.moe.experts"] == "partial"
    assert layouts["layers.0.moe.shared_experts"] == "partial"  # handed on from its down_proj as it is
    assert layouts["layers.0.mlp"] == "replicated"  # the all-reduced down_proj's own tensor
    local = set(merged.extra["ranks"]["rank_local"])
    assert local == set()  # every output that runs on every token is put back together
    assert "layers.0.moe.experts.local.0" in merged.skipped  # an expert sees only its tokens: no row per token
    by_name = {(m.name, m.tensor): m for m in merged.modules}
    compared = 0
    for m in single.modules:
        if m.name in local:
            continue
        other = by_name[(m.name, m.tensor)]
        assert other.features == m.features, m.name
        diff = float((other.rows["x"] - m.rows["x"]).norm() / m.rows["x"].norm().clamp_min(1e-30))
        assert diff < 1e-5, (m.name, diff)
        compared += 1
    assert compared >= 20
    result = compare_captures(single, merged, threshold=1e-5)
    assert result.first_divergent is None
    notes = {m.name: m.note for m in result.modules if m.status == "mismatch"}
    assert set(notes) == local and all("rank-local at TP 2" in n for n in notes.values())


def test_the_first_divergent_module_is_the_same_rank_by_rank_and_from_a_tp1_reference(runs: dict[str, Any]) -> None:
    at_one = compare_captures(runs["once1"][0], runs["twice1"][0], threshold=1e-4)
    by_rank = compare_captures(runs["once2"][0], runs["twice2"][0], threshold=1e-4)
    across = compare_captures(runs["once1"][0], runs["twice2"][0], threshold=1e-4)
    assert at_one.first_divergent == "layers.0.moe"  # the factor multiplies the experts' sum inside the unit
    assert by_rank.first_divergent == at_one.first_divergent == across.first_divergent


def test_the_scale_check_combines_each_unit_over_the_ranks_holding_its_experts(runs: dict[str, Any]) -> None:
    for variant, times in (("once", 1), ("twice", 2)):
        single, combined = runs[f"{variant}1"][1], runs[f"{variant}2"][1]
        for one, both in zip(single.units, combined.units, strict=True):
            assert one.times == both.times == times
            assert abs(both.exponent - times) < 1e-3
            assert (
                "output summed (each rank holds a part), shared experts summed (each rank holds a part)"
                in both.measured
            )
            assert both.measured.endswith("over ranks 0, 1")
            for a, b in zip(one.norms, both.norms, strict=True):
                assert abs(a - b) <= 1e-5 * a
    # the unit's output all-reduced inside it, its shared experts' a partial sum: each combined as it is held
    single, inside = runs["once1"][1], runs["inside2"][1]
    for one, both in zip(single.units, inside.units, strict=True):
        assert both.times == 1 and all(abs(a - b) <= 1e-5 * a for a, b in zip(one.norms, both.norms, strict=True))
        assert "output the same on every rank (taken once), shared experts summed" in both.measured
    single, combined, per_rank = runs["half1"][1], runs["half2"][1], runs["half2"][2]
    assert [u.verdict for u in single.units] == [u.verdict for u in combined.units] == ["not a power law"] * 2
    for one, both in zip(single.units, combined.units, strict=True):
        assert all(abs(a - b) <= 1e-5 * a for a, b in zip(one.norms, both.norms, strict=True))
    # rank 0 alone (the first half of the experts) would say "applied once": the combination is what is right
    from speedtrap.localize._live import _scale_result

    alone = _scale_result(per_rank[0][1], (), len(IDS), "ep")
    assert [u.times for u in alone.units] == [1, 1]


def test_ranks_that_disagree_on_a_replicated_output_are_named(runs: dict[str, Any]) -> None:
    merged = runs["skew2"][0]
    found = {(d["role"], d["rank"], d["module"]) for d in merged.extra["ranks"]["disagree"]}
    assert ("skew TP2", 1, "layers.0.norm1") in found
    result = compare_captures(runs["once2"][0], merged, threshold=1e-4)
    norm = next(m for m in result.modules if m.name == "layers.0.norm1")
    assert "skew TP2 rank 1 disagrees with rank 0" in norm.note


def test_bytes_and_seconds_are_measured_per_rank(runs: dict[str, Any]) -> None:
    one, two = runs["once1"][0], runs["once2"][0]
    per_rank = two.extra["ranks"]["per_rank"]
    assert [p["rank"] for p in per_rank] == [0, 1]
    assert all(p["raw_bytes"] > 0 and p["row_bytes"] > 0 and p["seconds"] >= 0 for p in per_rank)
    whole = sum(t.numel() * t.element_size() for m in one.modules for t in m.rows.values())
    assert max(p["row_bytes"] for p in per_rank) <= whole  # a rank holds no more than the whole at one rank


def test_module_rows_carry_a_layout() -> None:
    assert ModuleRows.__dataclass_fields__["layout"].default == Layout("replicated")


def _dump(folder: Path, rank: int, step: int, index: int, name: str, value: torch.Tensor) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tags = f"step={step}___rank={rank}___dump_index={index}___name={name}"
    torch.save({"value": value, "meta": {"name": name}}, folder / f"{tags}.pt")


def test_sglang_dumper_files_of_every_rank_are_read_and_put_back_together(tmp_path: Path) -> None:
    """One file set per rank (``rank=`` tag): a qkv output sharded in three blocks, a partial MoE output, a norm."""
    from speedtrap.localize._dumper import reduce_dump

    gen = torch.Generator().manual_seed(3)
    n, parts = 6, [8, 4, 4]  # one rank's q, k, v widths
    qkv = torch.randn(n, sum(parts) * 2, generator=gen)
    halves = [torch.randn(n, 10, generator=gen) for _ in range(2)]
    norm = torch.randn(n, 10, generator=gen)
    ids = list(range(200, 200 + n))

    def dump(folder: Path, world: int) -> None:
        for rank in range(world):
            pieces = _shards(qkv, parts, 2)[rank] if world == 2 else qkv
            moe = halves[rank] if world == 2 else halves[0] + halves[1]
            _dump(folder, rank, 0, 1, "input_ids", torch.tensor(ids))
            _dump(folder, rank, 0, 2, "positions", torch.arange(n))
            _dump(folder, rank, 0, 3, "non_intrusive__model.layers.0.input_layernorm.output", norm)
            _dump(folder, rank, 0, 4, "non_intrusive__model.layers.0.self_attn.qkv_proj.output", pieces)
            _dump(folder, rank, 0, 5, "non_intrusive__model.layers.0.mlp.experts.output", moe)

    dump(tmp_path / "one", 1)
    dump(tmp_path / "two", 2)
    layouts = {
        "model.layers.0.self_attn.qkv_proj": {"kind": "sharded", "parts": parts},
        "model.layers.0.mlp.experts": {"kind": "partial"},
        "model.layers.0.input_layernorm": {"kind": "replicated"},
    }
    one = reduce_dump(tmp_path / "one", ids, 0, "base", "sglang", (), 8)
    two = reduce_dump(tmp_path / "two", ids, 0, "trial", "sglang", (), 8, {0: layouts, 1: layouts})
    assert one.world == 1 and two.world == 2 and two.extra["ranks"]["disagree"] == []
    result = compare_captures(one, two, threshold=1e-6)
    compared = {m.name: m.rel_diff for m in result.modules}
    assert set(compared) == {n for n in layouts} and all(d is not None and d < 1e-6 for d in compared.values())
    no_layouts = reduce_dump(tmp_path / "two", ids, 0, "trial", "sglang", (), 8)  # no agent: undeclared
    assert set(no_layouts.extra["ranks"]["rank_local"]) == {
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.mlp.experts",
    }
    assert compare_captures(two, two).first_divergent is None  # rank by rank at one world size


def test_a_live_localize_says_how_the_ranks_were_read_and_names_disagreeing_ranks() -> None:
    from speedtrap.localize._on_stack import _ranks_words

    a = torch.randn(4, 6, generator=torch.Generator().manual_seed(5))
    replicated = Layout("replicated")
    same = merge_ranks([_rank("n", reduce_rows(a, CHANNELS), replicated, 6, r, 2) for r in range(2)])
    off = merge_ranks([_rank("n", reduce_rows(t, CHANNELS), replicated, 6, r, 2) for r, t in enumerate((a, a * 2))])
    assert _ranks_words(same, same, None) == "every rank (TP 2), layers compared rank by rank"
    words = _ranks_words(same, off, None)
    assert words.endswith("RANKS DISAGREE on a replicated output: trial rank 1 on n")
    single = _rank("n", reduce_rows(a, CHANNELS), replicated, 6, 0, 1)
    assert "unsharded (base at TP 1, trial 2)" in _ranks_words(single, same, None)
    assert _ranks_words(single, single, None) == ""
