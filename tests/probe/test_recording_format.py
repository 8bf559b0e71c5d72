"""The recording file: round trip, incremental writing, and every kind of bad file as one-line exit-2 errors.

No model here: the recordings are built from constructed distributions (a real file, written by the
real writer), so these run in the default (fast) pass.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from speedtrap.cli import app
from speedtrap.probe import (
    DivergenceSettings,
    Identity,
    KLStats,
    NoiseFloor,
    Recording,
    RecordingError,
    TokenDist,
    add_extension,
    read_recording,
)
from speedtrap.probe._recording_format import (
    FORMAT,
    VERSION,
    Block,
    Names,
    RecordingWriter,
    SequenceRecord,
    parse_recording,
)

SETTINGS = DivergenceSettings(lengths=(64,), sequences=2, decode_tokens=8, bucket_size=64, top_k=5)
IDENTITY = Identity("http", "tiny", "0123456789abcdef", "ids", None, "1.0", None, "openai")


def _dists(rng: random.Random, n: int, k: int) -> list[TokenDist]:
    out = []
    for _ in range(n):
        logits = [rng.gauss(0, 3) for _ in range(50)]
        z = math.log(sum(math.exp(x) for x in logits))
        lps = sorted(((f"token_id:{i}", x - z) for i, x in enumerate(logits)), key=lambda kv: -kv[1])[:k]
        out.append(TokenDist(lps[0][0], lps[0][1], dict(lps)))
    return out


def _sequence(index: int, seed: int = 0) -> SequenceRecord:
    rng = random.Random(seed + index)
    ids = [rng.randrange(50) for _ in range(64)]
    names = Names(None)
    prefill = Block.of_dists(list(range(1, 64)), _dists(rng, 63, 5), names)
    decode = Block.of_dists(list(range(56, 64)), _dists(rng, 8, 5), names)
    return SequenceRecord(64, index, tuple(ids), None, names, tuple(ids), prefill, "greedy", 56,
                          tuple(rng.randrange(50) for _ in range(8)), decode)  # fmt: skip


def _header(version: int = VERSION) -> dict[str, object]:
    return {"type": "header", "format": FORMAT, "version": version, "identity": IDENTITY.to_json(),
            "probes": {"divergence": SETTINGS.to_json(), "recall": None}}  # fmt: skip


def write_recording(path: Path, complete: bool = True, version: int = VERSION) -> Path:
    writer = RecordingWriter(path, _header(version))
    for i in range(SETTINGS.sequences):
        writer.write(_sequence(i).to_json())
    if complete:
        writer.write({"type": "end"})
    writer.close()
    return path


def test_round_trip_keeps_every_distribution_to_float32(tmp_path: Path) -> None:
    path = write_recording(tmp_path / "r.strec")
    rec = read_recording(path)
    assert rec.identity == IDENTITY and rec.divergence == SETTINGS and len(rec.sequences) == 2
    original = _sequence(1)
    loaded = next(s for s in rec.sequences if s.index == 1)
    names = original.token_names()
    for a, b in zip(original.prefill.dists(names[1:], original.names), loaded.prefill.dists(names[1:], loaded.names),
                    strict=True):  # fmt: skip
        assert a.top.keys() == b.top.keys()
        assert all(abs(a.top[t] - b.top[t]) < 1e-6 for t in a.top)
    # Each record is its own gzip member: the whole file is one valid gzip stream of JSON lines.
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    assert [json.loads(line)["type"] for line in lines] == [
        "header",
        "divergence.sequence",
        "divergence.sequence",
        "end",
    ]


def test_text_pieces_are_kept_as_a_table(tmp_path: Path) -> None:
    dists = [TokenDist("Hello", -0.5, {"Hello": -0.5, " world": -1.5}), TokenDist(" world", -0.1, {" world": -0.1})]
    names = Names.for_names(["Hello", " world"])
    block = Block.of_dists([1, 2], dists, names)
    assert names.pieces == ["Hello", " world"]
    again = Block.from_json(json.loads(json.dumps(block.to_json())), "b")
    tops = [d.top for d in again.dists(["Hello", " world"], Names(names.pieces))]
    assert tops == [{"Hello": -0.5, " world": -1.5}, {" world": pytest.approx(-0.1, abs=1e-7)}]


def test_extension_point_keeps_a_floor_and_unknown_names(tmp_path: Path) -> None:
    path = write_recording(tmp_path / "r.strec")
    stats = KLStats.of([0.0, 1e-5], [True, True], [])
    floor = NoiseFloor(stats, stats, stats, exact=False, source="http://gpu:8000")
    add_extension(path, "floor", floor.to_json())
    add_extension(path, "something-newer", [1, 2])
    rec = read_recording(path)
    assert rec.extensions == {"floor": floor.to_json(), "something-newer": [1, 2]}
    assert rec.floor is not None and rec.floor.to_json() == floor.to_json()
    add_extension(path, "floor", {"decode.kl_p99": 1e-5})  # not a floor: refused on load, in one line
    with pytest.raises(RecordingError, match="invalid noise floor"):
        read_recording(path)


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95])
def test_a_cut_short_file_is_truncated_and_resume_keeps_the_whole_records(tmp_path: Path, cut: float) -> None:
    path = write_recording(tmp_path / "r.strec")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(RecordingError) as err:
        read_recording(path)
    assert "truncated" in err.value.problem or "interrupted" in err.value.problem
    raw = parse_recording(path.read_bytes(), "r")
    # Resuming trims the partial member and appends after the last whole record.
    writer = RecordingWriter(path, None, raw.good_bytes)
    have = {s.index for s in raw.sequences}
    for i in range(SETTINGS.sequences):
        if i not in have:
            writer.write(_sequence(i).to_json())
    writer.write({"type": "end"})
    writer.close()
    rec = read_recording(path)
    assert sorted(s.index for s in rec.sequences) == [0, 1]


def _one_line_exit_2(args: list[str], *needles: str) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert "Traceback" not in text and len(text.splitlines()) <= 2, text  # rich may wrap one long line
    for needle in needles:
        assert needle in text, text
    return text


def _cli_bad(path: Path, *needles: str) -> None:
    _one_line_exit_2(["probe", "divergence", "--target", "http://127.0.0.1:9", "--baseline", str(path)], *needles)
    _one_line_exit_2(["check", "--against", str(path), "--target", "http://127.0.0.1:9"], *needles)


def test_bad_files_are_one_line_exit_2(tmp_path: Path) -> None:
    good = write_recording(tmp_path / "good.strec").read_bytes()
    truncated = tmp_path / "truncated.strec"
    truncated.write_bytes(good[: len(good) // 2])
    _cli_bad(truncated, "truncated")
    corrupt = tmp_path / "corrupt.strec"
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(flipped))
    _cli_bad(corrupt, "corrupt")
    newer = write_recording(tmp_path / "newer.strec", version=VERSION + 1)
    _cli_bad(newer, f"version {VERSION + 1}", "upgrade speedtrap")
    unfinished = write_recording(tmp_path / "unfinished.strec", complete=False)
    _cli_bad(unfinished, "interrupted", "--resume")
    other = tmp_path / "other.strec"
    other.write_bytes(gzip.compress(b'{"hello": 1}\n'))
    _cli_bad(other, "not a speedtrap recording")


def test_other_lengths_are_refused_naming_the_field(tmp_path: Path) -> None:
    path = write_recording(tmp_path / "r.strec")
    _one_line_exit_2(
        ["probe", "divergence", "--target", "http://127.0.0.1:9", "--baseline", str(path), "--lengths", "128"],
        "lengths", "[64]", "[128]",
    )  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damage_is_a_recording_error_never_a_crash(data: st.DataObject) -> None:
    good = _GOOD
    kind = data.draw(st.sampled_from(["cut", "flip", "splice", "garbage"]))
    if kind == "cut":
        damaged = good[: data.draw(st.integers(0, len(good) - 1))]
    elif kind == "flip":
        i = data.draw(st.integers(0, len(good) - 1))
        damaged = good[:i] + bytes([good[i] ^ data.draw(st.integers(1, 255))]) + good[i + 1 :]
    elif kind == "splice":
        damaged = good + data.draw(st.binary(min_size=1, max_size=64))
    else:
        damaged = data.draw(st.binary(max_size=256))
    try:
        Recording.from_bytes(damaged, "x")
    except RecordingError as exc:
        assert exc.fix and "\n" not in exc.one_line()


KEYS = ["type", "length", "index", "prompt", "tokens", "prefill", "decode", "pieces"]
VALUES = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.lists(st.integers(), max_size=3),
                   st.just("divergence.sequence"), st.just({"ids": ""}))  # fmt: skip


@given(record=st.dictionaries(st.sampled_from(KEYS), VALUES))
@settings(max_examples=200, deadline=None)
def test_malformed_records_are_rejected_by_the_one_parser(record: dict[str, object]) -> None:
    payload = gzip.compress(json.dumps(_header()).encode()) + gzip.compress(json.dumps(record).encode())
    try:
        raw = parse_recording(payload, "x")
    except RecordingError:
        return
    assert record.get("type") in ("end", "extension") or raw.sequences


def _good_bytes() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return write_recording(Path(d) / "g.strec").read_bytes()


_GOOD = _good_bytes()


def test_block_arrays_agree(tmp_path: Path) -> None:
    block = _sequence(0).prefill
    bad = dict(block.to_json(), counts=Block(np.array([1], "<i4"), np.array([9], "<u2"), block.ids, block.logprobs,
                                             block.own, block.tail).to_json()["counts"])  # fmt: skip
    with pytest.raises(ValueError, match=r"differ in length|add up"):
        Block.from_json(bad, "b")


def test_a_recording_asked_through_another_api_is_refused() -> None:
    """A vLLM-native recording against a candidate asked the OpenAI way compares two different scorings."""
    from dataclasses import replace

    from speedtrap.probe._recording import identity_mismatch

    vllm = replace(IDENTITY, api="vllm")
    error = identity_mismatch(vllm, IDENTITY)
    assert error is not None
    assert "'vllm' API" in str(error) and "'openai'" in str(error) and "probe.api = 'vllm'" in error.fix
    assert identity_mismatch(vllm, vllm) is None
    assert identity_mismatch(replace(IDENTITY, api=None), IDENTITY) is None  # an older recording names no api
