"""The live localizer's parts without a server: launch env, agent loading, formats, parsers, errors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from speedtrap._errors import ServerError
from speedtrap.localize import (
    AGENT_PATH,
    AgentLink,
    Capture,
    ModuleRows,
    Noise,
    agent_env,
    compare_captures,
    load_capture,
    parse_capture,
    parse_dump_name,
    save_capture,
)
from speedtrap.localize._capture import ROW_FIELDS, AgentSource, DumperSource
from speedtrap.localize._dumper import output_of, reduce_dump
from speedtrap.localize._scale import gram_of, unit_from_gram


def test_agent_env_puts_the_agent_first_and_appends_it_to_a_vllm_allowlist(tmp_path: Path) -> None:
    env = agent_env(tmp_path / "a", {"PYTHONPATH": "/x:/y", "VLLM_PLUGINS": "speedtrap_example"})
    assert env["SPEEDTRAP_AGENT_DIR"] == str((tmp_path / "a").resolve())
    assert env["PYTHONPATH"].split(os.pathsep) == [str(AGENT_PATH), "/x", "/y"]
    assert env["VLLM_PLUGINS"] == "speedtrap_example,speedtrap_agent"
    assert "VLLM_PLUGINS" not in agent_env(tmp_path, {})  # unset: vLLM loads every plugin, ours included


_PROBE = """
import importlib.metadata, json, os, sys
import speedtrap_agent
eps = [e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "speedtrap_agent"]
finders = [type(f).__name__ for f in sys.meta_path if type(f).__module__ == "speedtrap_agent"]
print(json.dumps({"chained": os.environ.get("CHAINED_MARK"), "eps": eps, "finders": finders}))
"""


@pytest.mark.parametrize("armed", [True, False])
def test_sitecustomize_chains_then_installs_and_the_plugin_entry_point_is_found(tmp_path: Path, armed: bool) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED_MARK'] = 'ran'\n")
    env = {k: v for k, v in os.environ.items() if k != "SPEEDTRAP_AGENT_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(AGENT_PATH), str(other)])
    if armed:
        env["SPEEDTRAP_AGENT_DIR"] = str(tmp_path / "agent")
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["chained"] == "ran"  # the other sitecustomize ran first
    assert out["eps"] == ["speedtrap_agent:register"]
    assert out["finders"] == (["_Finder"] if armed else [])  # nothing happens without SPEEDTRAP_AGENT_DIR


def _rows(n: int, channels: int, seed: int, positions: list[int] | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pos = torch.tensor(positions if positions is not None else list(range(n)), dtype=torch.long)
    return {
        "x": torch.randn(n, channels, generator=g), "sq": torch.rand(n, generator=g, dtype=torch.float64),
        "max": torch.rand(n, generator=g), "pos": pos, "ids": pos + 100, "occ": torch.zeros(n, dtype=torch.long),
        "fwd": torch.zeros(n, dtype=torch.long),
    }  # fmt: skip


def _capture(modules: list[ModuleRows], prompt: int, channels: int, dumper: bool = False) -> Capture:
    source = DumperSource("sglang-dumper", "exp", 3) if dumper else AgentSource("agent", 7, "vllm", "LlamaForCausalLM")
    return Capture(source, "base", "vllm", ("p",), tuple(range(100, 100 + prompt)), 2, channels, tuple(modules), 3)


names = st.text(st.characters(codec="ascii", categories=("L", "N"), include_characters="._"), max_size=30)


@settings(max_examples=25, deadline=None)
@given(
    spec=st.lists(st.tuples(names, st.integers(0, 2), st.integers(1, 40), st.integers(0, 6)), max_size=4),
    channels=st.integers(1, 16),
    dumper=st.booleans(),
    noise=st.one_of(st.none(), st.floats(0, 1)),
)
def test_a_capture_round_trips_through_its_file(
    tmp_path_factory: pytest.TempPathFactory, spec: list[tuple[str, int, int, int]], channels: int, dumper: bool,
    noise: float | None,
) -> None:  # fmt: skip
    modules = [
        ModuleRows(name, tensor, features, _rows(n, min(features, channels), i))
        for i, (name, tensor, features, n) in enumerate(spec)
    ]
    capture = _capture(modules, 5, channels, dumper)
    if noise is not None:
        capture = Capture(**{**capture.__dict__, "noise": Noise(noise, "m", 4)})
    path = tmp_path_factory.mktemp("cap") / "x.capture"
    save_capture(capture, path)
    back = load_capture(path, "base")
    assert back.header() == capture.header()
    for a, b in zip(back.modules, capture.modules, strict=True):
        assert all(torch.equal(a.rows[k], b.rows[k]) for k in ROW_FIELDS)


@settings(max_examples=60, deadline=None)
@given(
    path=st.lists(st.sampled_from(["format", "version", "source", "modules", "channels", "prompt", "noise", "role"])),
    value=st.one_of(
        st.none(), st.integers(-3, 3), st.text(max_size=5), st.floats(allow_nan=True), st.just([]),
        st.just({"kind": "other"}), st.just([{"name": "a"}]),
    ),
)  # fmt: skip
def test_a_damaged_header_is_rejected_as_invalid_never_with_another_exception(path: list[str], value: object) -> None:
    good = _capture([ModuleRows("a", 0, 3, _rows(2, 3, 0))], 2, 8)
    header = json.loads(json.dumps(good.header()))
    tensors = {f"m0.{k}": v for k, v in good.modules[0].rows.items()}
    for key in path:
        header[key] = value
    try:
        parsed = parse_capture(header, tensors)
    except (ValueError, KeyError, TypeError):
        return
    assert isinstance(parsed, Capture)


def test_wrong_row_dtypes_or_lengths_are_invalid() -> None:
    good = _capture([ModuleRows("a", 0, 3, _rows(2, 3, 0))], 2, 8)
    header = good.header()
    tensors = {f"m0.{k}": v for k, v in good.modules[0].rows.items()}
    with pytest.raises(ValueError, match="dtype"):
        parse_capture(header, {**tensors, "m0.sq": tensors["m0.sq"].float()})
    with pytest.raises(ValueError, match="rows"):
        parse_capture(header, {**tensors, "m0.pos": tensors["m0.pos"][:1]})
    with pytest.raises(KeyError):
        parse_capture(header, {k: v for k, v in tensors.items() if k != "m0.x"})


tag_values = st.one_of(st.integers(-5, 10**6), st.text(st.characters(codec="ascii", categories=("L", "N")), min_size=1))
module_names = st.lists(st.sampled_from(["model", "layers", "0", "12", "mlp", "experts", "self_attn", "qkv_proj"]),
                        max_size=5).map(".".join)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(
    step=st.integers(0, 99), index=st.integers(1, 10**5), module=module_names,
    out=st.one_of(st.none(), st.integers(0, 3)),
    extra=st.dictionaries(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), tag_values, max_size=3),
)  # fmt: skip
def test_the_dumper_file_name_parser_reads_what_sglang_writes(
    step: int, index: int, module: str, out: int | None, extra: dict[str, object]
) -> None:
    name = "non_intrusive__" + ".".join(p for p in (module, "output", None if out is None else str(out)) if p)
    extra = {k: v for k, v in extra.items() if k not in ("step", "rank", "dump_index", "name")}
    tags = {"step": step, "rank": 0, "dump_index": index, "name": name, **extra}
    filename = "___".join(f"{k}={v}" for k, v in tags.items()) + ".pt"  # dumper.py's _format_tags + ".pt"
    parsed = parse_dump_name(filename)
    assert parsed == {k: (int(v) if isinstance(v, str) and v.lstrip("-").isdigit() else v) for k, v in tags.items()}
    assert output_of(name) == (module, out or 0)


@pytest.mark.parametrize("bad", ["x.pt", "step=1___name=a.txt", "step=a___dump_index=1___name=b.pt", "dump_index=1.pt"])
def test_a_file_the_dumper_did_not_write_is_rejected(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_dump_name(bad)


def _dump(folder: Path, step: int, index: int, name: str, value: torch.Tensor, layer: int | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tags = f"step={step}___rank=0___dump_index={index}___name={name}___recompute_status=disabled"
    tags += "" if layer is None else f"___layer_id={layer}"
    torch.save({"value": value, "meta": {"step": step, "name": name, "world_size": 1}}, folder / f"{tags}.pt")


def _fake_dump(folder: Path, scale: float) -> None:
    """Two forwards (a 4-token prefill, one decode step) of a two-module model, in SGLang's format."""
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(5, 6, generator=g)
    for step, (lo, hi) in enumerate([(0, 4), (4, 5)]):
        index = step * 10
        _dump(folder, step, index + 1, "input_ids", torch.arange(100 + lo, 100 + hi))
        _dump(folder, step, index + 2, "positions", torch.arange(lo, hi))
        _dump(folder, step, index + 3, "non_intrusive__model.layers.0.self_attn.output", hidden[lo:hi].bfloat16())
        _dump(folder, step, index + 4, "non_intrusive__model.layers.0.mlp.output", hidden[lo:hi] * scale)
        _dump(folder, step, index + 5, "non_intrusive__model.layers.0.mlp.output", hidden[lo:hi])  # a second call
        # one rotary embedding shared by both layers: hooked once, under layer 0's name, tagged by the caller
        rope = "non_intrusive__model.layers.0.self_attn.rotary_emb.output"
        _dump(folder, step, index + 6, rope, hidden[lo:hi], layer=0)
        _dump(folder, step, index + 7, rope, hidden[lo:hi] * (1 if scale == 1.0 else 3), layer=1)


def test_dumper_files_reduce_to_a_capture_that_compares_like_the_agents(tmp_path: Path) -> None:
    _fake_dump(tmp_path / "base", 1.0)
    _fake_dump(tmp_path / "trial", 2.0)
    base = reduce_dump(tmp_path / "base", list(range(100, 104)), 1, "base", "sglang", (), 4)
    trial = reduce_dump(tmp_path / "trial", list(range(100, 104)), 1, "trial", "sglang", ("x",), 4)
    assert base.raw_bytes > 0 and base.forwards == 2 and isinstance(base.source, DumperSource)
    mlp = next(m for m in base.modules if m.name == "model.layers.0.mlp")
    assert mlp.features == 6 and mlp.rows["x"].shape == (10, 4)  # 5 positions x 2 calls, 4 of 6 channels
    result = compare_captures(base, trial)
    assert result.first_divergent == "model.layers.0.mlp"
    assert result.module("model.layers.0.self_attn").rel_diff == 0.0
    assert result.module("model.layers.0.self_attn.rotary_emb").rel_diff == 0.0  # layer 0's calls
    assert (result.module("model.layers.1.self_attn.rotary_emb").rel_diff or 0) > 0.1  # layer 1's
    assert result.tokens == 5 and result.decode_tokens == 1


def test_missing_dumper_files_are_an_error_naming_the_role_and_folder(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=r"the trial server's dumper wrote no file in .*nothing"):
        reduce_dump(tmp_path / "nothing", [1, 2], 0, "trial", "sglang", (), 4)
    _fake_dump(tmp_path / "bad", 1.0)
    victim = next((tmp_path / "bad").glob("*mlp.output*.pt"))
    victim.write_bytes(b"not a torch file")
    with pytest.raises(ServerError, match=r"the base dump file .*mlp\.output.* is unreadable"):
        reduce_dump(tmp_path / "bad", [100, 101, 102, 103], 1, "base", "sglang", (), 4)


def test_agent_link_errors_name_the_role_and_the_file(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="no speedtrap agent attached to a model in the prefill server"):
        AgentLink(tmp_path, "prefill", timeout=0.2).agents()
    link = AgentLink(tmp_path, "decode", timeout=0.2)
    with pytest.raises(ServerError, match=r"the decode server's agent did not read .*command\.json"):
        link.send("capture")
    with pytest.raises(ServerError, match=r"the decode server's agent wrote no .*results/c1/9/done"):
        link.result("c1", 9)
    (tmp_path / "results" / "c2" / "9").mkdir(parents=True)
    (tmp_path / "results" / "c2" / "9" / "done").write_text('{"ok": false, "error": "ValueError: boom"}')
    with pytest.raises(ServerError, match="the decode server's agent failed: ValueError: boom"):
        link.result("c2", 9)


def test_the_gram_verdict_is_the_norm_verdict() -> None:
    g = torch.Generator().manual_seed(1)
    base = torch.randn(3, 8, generator=g, dtype=torch.float64)
    values = [0.5, 1.0, 2.0, 4.0]
    twice = unit_from_gram("layers.3.mlp", "output", (), values, gram_of([base * v**2 for v in values]), 1.0)
    assert twice.times == 2 and twice.exponent == pytest.approx(2.0, abs=1e-12)
    assert twice.shape_residual is not None and twice.shape_residual < 1e-6
    assert twice.norms[1] == pytest.approx(float(base.norm()))
    bent = unit_from_gram("l.0", "output", (), values, gram_of([base * v + torch.tanh(base * v) for v in values]), 1.0)
    assert bent.verdict == "not a power law" and bent.times is None
    assert math.isnan(float("nan"))  # (the JSON of a Gram never holds one: scale_live rejects it)


class _Rope(torch.nn.Module):
    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x * (1 + positions.unsqueeze(-1).float())


class _Layer(torch.nn.Module):
    def __init__(self, rope: torch.nn.Module, gain: float) -> None:
        super().__init__()
        self.proj, self.rotary_emb, self.gain = torch.nn.Linear(4, 4), rope, gain

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.rotary_emb(positions, self.proj(x) * self.gain)


class _Model(torch.nn.Module):
    """vLLM's shape: flat input_ids and positions; one rotary embedding shared by every layer."""

    def __init__(self, gains: tuple[float, float]) -> None:
        super().__init__()
        torch.manual_seed(0)
        rope = _Rope()
        self.embed = torch.nn.Embedding(50, 4)
        self.layers = torch.nn.ModuleList(_Layer(rope, g) for g in gains)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(positions, x)
        return x


def _agent_capture(model: torch.nn.Module, out: Path) -> Capture:
    from types import SimpleNamespace

    from speedtrap.localize._capture import keep_prompt_rows
    from speedtrap.localize.agent.speedtrap_agent.rows import Capture as AgentCapture

    agent = SimpleNamespace(root=model, engine="vllm")
    capture = AgentCapture(agent, {"id": "c", "channels": 3})  # type: ignore[arg-type]
    for ids, pos in (([1, 2, 3], [0, 1, 2]), ([4], [3])):  # a prefill, then one decode step
        kwargs = {"input_ids": torch.tensor(ids), "positions": torch.tensor(pos)}
        capture.begin((), kwargs)
        with torch.no_grad():
            model(**kwargs)
        capture.layout = None
    out.mkdir(parents=True, exist_ok=True)
    capture.finish(out)
    from safetensors.torch import load_file

    meta, tensors = json.loads((out / "capture.json").read_text()), load_file(str(out / "capture.safetensors"))
    modules = [
        keep_prompt_rows(m["name"], m["tensor"], m["features"], {k: tensors[f"{m['key']}.{k}"] for k in ROW_FIELDS},
                         [1, 2, 3])
        for m in meta["modules"]
    ]  # fmt: skip
    return Capture(AgentSource("agent", 1, "vllm", "M"), "base", "vllm", (), (1, 2, 3), 1, 3, tuple(modules), 2)


def test_the_agent_names_a_shared_module_by_the_layer_that_calls_it(tmp_path: Path) -> None:
    base = _agent_capture(_Model((1.0, 1.0)), tmp_path / "base")
    names = [m.name for m in base.modules]
    assert "layers.0.rotary_emb" in names and "layers.1.rotary_emb" in names
    assert all(m.count == 4 for m in base.modules)  # 3 prompt rows + 1 decode row each
    assert next(m for m in base.modules if m.name == "layers.0.proj").rows["x"].shape == (4, 3)  # 3 of 4 channels
    trial = _agent_capture(_Model((1.0, 2.0)), tmp_path / "trial")
    result = compare_captures(base, trial)
    assert result.first_divergent == "layers.1.rotary_emb"  # not layers.0.rotary_emb: its layer-0 calls agree
    assert result.module("layers.1.proj").rel_diff == 0.0  # the gain comes after the projection
    assert result.module("layers.0.rotary_emb").rel_diff == 0.0
    assert result.decode_tokens == 1 and result.tokens == 4
