"""The recording file: one parser and one writer for what a baseline answered (see schemas/recording.schema.json).

A recording is a sequence of gzip members, each holding one JSON object (a *record*); concatenated
members are one valid gzip stream (``zcat FILE`` prints the records as JSON lines). Records are a
tagged union on ``type``:

- ``header`` (always first): format name and version, the target's identity, the probe settings;
- ``divergence.sequence``: one teacher-forced sequence: the prompt, and per position the top-k token
  ids and logprobs, the correct token's logprob and the tail mass (prefill and decode);
- ``recall.sample``: one recall answer with its scoring;
- ``extension``: named optional data (``floor``: a noise floor); readers keep names they do not know;
- ``end``: the recording is complete.

Arrays are little-endian and base64-encoded (int32 ids and positions, uint16 counts, float32 logprobs
and tail masses; NaN where a logprob is unknown). Each record is appended as its own gzip member
and synced, so an interrupted ``record`` keeps every finished record and ``--resume`` continues
after the last whole one.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import math
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from speedtrap._errors import StoreError, UsageError
from speedtrap.probe._backend import TokenDist

FORMAT = "speedtrap-recording"
VERSION = 1
Array = np.ndarray[Any, Any]
RECORD_TYPES = ("header", "divergence.sequence", "recall.sample", "extension", "end")
ID_PREFIX = "token_id:"


class RecordingError(StoreError):
    """A recording that cannot be read: truncated, corrupt, not a recording, or newer than this reader."""


# -- arrays ------------------------------------------------------------------------------------


def pack(values: Sequence[float] | Sequence[int] | Array, dtype: str) -> str:
    return base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode("ascii")


def unpack(data: Any, dtype: str, where: str) -> Array:
    if not isinstance(data, str):
        raise ValueError(f"{where} is not a base64 string")
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"{where} is not valid base64") from None
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise ValueError(f"{where} has {len(raw)} bytes, not a multiple of {size}")
    return np.frombuffer(raw, dtype=dtype)


# -- positions: top-k distributions ------------------------------------------------------------


class Names:
    """Token names as integers: ``token_id:N`` is N; any other name (a text piece) gets an index into ``pieces``."""

    def __init__(self, pieces: Sequence[str] | None = None) -> None:
        self.pieces: list[str] | None = list(pieces) if pieces is not None else None
        self._index = {p: i for i, p in enumerate(self.pieces or [])}

    @classmethod
    def for_names(cls, names: Sequence[str]) -> Names:
        ids = all(n.startswith(ID_PREFIX) and n[len(ID_PREFIX) :].isdigit() for n in names)
        return cls(None if ids else [])

    def code(self, name: str) -> int:
        if self.pieces is None:
            return int(name[len(ID_PREFIX) :])
        if name not in self._index:
            self._index[name] = len(self.pieces)
            self.pieces.append(name)
        return self._index[name]

    def name(self, code: int) -> str:
        if self.pieces is None:
            return f"{ID_PREFIX}{code}"
        if not 0 <= code < len(self.pieces):
            raise ValueError(f"token index {code} is outside the recorded pieces")
        return self.pieces[code]


@dataclass(frozen=True)
class Block:
    """Top-k distributions at some positions: flat arrays (``counts[i]`` entries for position ``i``)."""

    positions: Array  # int32 [n]
    counts: Array  # uint16 [n]
    ids: Array  # int32 [sum(counts)], each position's entries by decreasing logprob
    logprobs: Array  # float32 [sum(counts)]
    own: Array  # float32 [n]: the correct (or chosen) token's logprob, NaN if unknown
    tail: Array  # float32 [n]: probability mass outside the listed tokens

    def to_json(self) -> dict[str, str]:
        return {
            "positions": pack(self.positions, "<i4"),
            "counts": pack(self.counts, "<u2"),
            "ids": pack(self.ids, "<i4"),
            "logprobs": pack(self.logprobs, "<f4"),
            "own": pack(self.own, "<f4"),
            "tail": pack(self.tail, "<f4"),
        }

    @classmethod
    def from_json(cls, data: Any, where: str) -> Block:
        if not isinstance(data, dict):
            raise ValueError(f"{where} is not an object")
        get = {k: data.get(k) for k in ("positions", "counts", "ids", "logprobs", "own", "tail")}
        block = cls(
            unpack(get["positions"], "<i4", f"{where}.positions"),
            unpack(get["counts"], "<u2", f"{where}.counts"),
            unpack(get["ids"], "<i4", f"{where}.ids"),
            unpack(get["logprobs"], "<f4", f"{where}.logprobs"),
            unpack(get["own"], "<f4", f"{where}.own"),
            unpack(get["tail"], "<f4", f"{where}.tail"),
        )
        n = len(block.positions)
        if not len(block.counts) == len(block.own) == len(block.tail) == n:
            raise ValueError(f"{where}: positions, counts, own and tail differ in length")
        if int(block.counts.sum()) != len(block.ids) or len(block.ids) != len(block.logprobs):
            raise ValueError(f"{where}: counts do not add up to the ids and logprobs")
        if n and (np.any(block.positions < 0) or np.any(np.diff(block.positions) <= 0)):
            raise ValueError(f"{where}: positions are not increasing")
        return block

    @classmethod
    def of_dists(cls, positions: Sequence[int], dists: Sequence[TokenDist], names: Names) -> Block:
        counts: list[int] = []
        ids: list[int] = []
        lps: list[float] = []
        own: list[float] = []
        tail: list[float] = []
        for d in dists:
            entries = sorted(d.top.items(), key=lambda kv: -kv[1])
            counts.append(len(entries))
            ids.extend(names.code(t) for t, _ in entries)
            lps.extend(lp for _, lp in entries)
            own.append(math.nan if d.logprob is None else d.logprob)
            tail.append(max(0.0, 1.0 - math.fsum(math.exp(lp) for _, lp in entries)))
        return cls(
            np.asarray(positions, "<i4"), np.asarray(counts, "<u2"), np.asarray(ids, "<i4"),
            np.asarray(lps, "<f4"), np.asarray(own, "<f4"), np.asarray(tail, "<f4"),
        )  # fmt: skip

    def dists(self, tokens: Sequence[str], names: Names) -> list[TokenDist]:
        """Each position's distribution; ``tokens[i]`` names the token it predicts (or chose)."""
        out: list[TokenDist] = []
        ids, lps, own = self.ids.tolist(), self.logprobs.astype(np.float64).tolist(), self.own.tolist()
        start = 0
        for i, count in enumerate(self.counts.tolist()):
            top = {
                names.name(t): lp for t, lp in zip(ids[start : start + count], lps[start : start + count], strict=True)
            }
            start += count
            out.append(TokenDist(tokens[i], None if math.isnan(own[i]) else float(own[i]), top))
        return out


# -- records -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SequenceRecord:
    """One divergence sequence as the baseline answered it.

    ``prompt_ids`` (or ``prompt_text`` for a server that takes text only) is what was sent;
    ``tokens`` the prompt's tokens as named by the backend. ``decode_mode`` is ``teacher_forced``
    (in-process: the prompt's last tokens fed one by one) or ``greedy`` (servers: the baseline's own
    greedy continuation of the prompt cut at ``decode_start``, ``decode_tokens`` its choices).
    """

    length: int
    index: int
    prompt_ids: tuple[int, ...] | None
    prompt_text: str | None
    names: Names
    tokens: tuple[int, ...]
    prefill: Block
    decode_mode: str
    decode_start: int
    decode_tokens: tuple[int, ...]
    decode: Block

    @property
    def key(self) -> tuple[int, int]:
        return (self.length, self.index)

    def token_names(self) -> list[str]:
        return [self.names.name(t) for t in self.tokens]

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "divergence.sequence",
            "length": self.length,
            "index": self.index,
            "prompt": {"ids": pack(self.prompt_ids, "<i4")}
            if self.prompt_ids is not None
            else {"text": self.prompt_text},
            "pieces": self.names.pieces,
            "tokens": pack(self.tokens, "<i4"),
            "prefill": self.prefill.to_json(),
            "decode": {
                "mode": self.decode_mode,
                "start": self.decode_start,
                "tokens": pack(self.decode_tokens, "<i4"),
                **self.decode.to_json(),
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SequenceRecord:
        prompt = _obj(data.get("prompt"), "prompt")
        ids = tuple(unpack(prompt["ids"], "<i4", "prompt.ids").tolist()) if "ids" in prompt else None
        text = prompt.get("text") if ids is None else None
        if ids is None and not isinstance(text, str):
            raise ValueError("prompt has neither ids nor text")
        pieces = data.get("pieces")
        if pieces is not None and (not isinstance(pieces, list) or not all(isinstance(p, str) for p in pieces)):
            raise ValueError("pieces is not a list of strings")
        decode = _obj(data.get("decode"), "decode")
        mode = decode.get("mode")
        if mode not in ("teacher_forced", "greedy"):
            raise ValueError(f"decode.mode {mode!r} is not teacher_forced or greedy")
        record = cls(
            _int(data.get("length"), "length"), _int(data.get("index"), "index"), ids, text, Names(pieces),
            tuple(unpack(data.get("tokens"), "<i4", "tokens").tolist()),
            Block.from_json(data.get("prefill"), "prefill"),
            mode, _int(decode.get("start"), "decode.start"),
            tuple(unpack(decode.get("tokens"), "<i4", "decode.tokens").tolist()), Block.from_json(decode, "decode"),
        )  # fmt: skip
        if len(record.decode_tokens) != len(record.decode.positions):
            raise ValueError("decode.tokens and decode positions differ in length")
        if record.prefill.positions.size and int(record.prefill.positions.max()) >= len(record.tokens):
            raise ValueError("a prefill position lies past the prompt's tokens")
        if record.names.pieces is not None:
            for code in (
                *record.tokens,
                *record.decode_tokens,
                *record.prefill.ids.tolist(),
                *record.decode.ids.tolist(),
            ):
                record.names.name(int(code))  # raises for an index outside the pieces
        return record


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} is not an object")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} is not an integer")
    return value


@dataclass
class RawRecording:
    """The records of a file, validated, with where the last whole record ends (for ``--resume``)."""

    header: dict[str, Any]
    sequences: list[SequenceRecord] = field(default_factory=list)
    recall: list[dict[str, Any]] = field(default_factory=list)
    extensions: dict[str, Any] = field(default_factory=dict)
    complete: bool = False
    good_bytes: int = 0
    truncated: bool = False


def _members(data: bytes) -> Iterator[tuple[bytes | None, int]]:
    """Each gzip member's content and the offset where it ends; ``None`` for a cut-short last member."""
    pos = 0
    while pos < len(data):
        d = zlib.decompressobj(wbits=31)
        try:
            out = d.decompress(data[pos:])
        except zlib.error as exc:
            raise RecordingError(f"corrupt at byte {pos}: {exc}") from None
        if not d.eof:
            yield None, pos
            return
        end = len(data) - len(d.unused_data)
        yield out, end
        pos = end


def parse_recording(data: bytes, where: str) -> RawRecording:
    """Every record of a recording file's bytes, each validated; one-line errors name the problem."""
    fix = "record it again (speedtrap record ... --out FILE)"
    raw: RawRecording | None = None
    try:
        for content, end in _members(data):
            if content is None:
                if raw is None:
                    raise RecordingError(f"{where} is truncated before its header", fix)
                raw.truncated = True
                break
            try:
                record = json.loads(content)
            except ValueError:
                raise RecordingError(f"{where} is corrupt: a record is not JSON (before byte {end})", fix) from None
            if raw is None:
                raw = RawRecording(_header(record, where))
            else:
                _add(raw, record, where, end)
            raw.good_bytes = end
    except RecordingError as exc:
        if exc.fix is None:
            raise RecordingError(f"{where} is {exc.problem}", fix) from None
        raise
    if raw is None:
        raise RecordingError(f"{where} is empty", fix)
    return raw


def _header(record: Any, where: str) -> dict[str, Any]:
    if not isinstance(record, dict) or record.get("type") != "header" or record.get("format") != FORMAT:
        raise RecordingError(f"{where} is not a speedtrap recording", "pass a file written by speedtrap record")
    version = record.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise RecordingError(f"{where} has no format version", "record it again")
    if version > VERSION:
        raise RecordingError(
            f"{where} has recording format version {version}, newer than this speedtrap reads ({VERSION})",
            "upgrade speedtrap (pip install -U speedtrap)",
        )
    for key in ("identity", "probes"):
        if not isinstance(record.get(key), dict):
            raise RecordingError(f"{where}: the header lacks {key}", "record it again")
    return record


def _add(raw: RawRecording, record: Any, where: str, end: int) -> None:
    kind = record.get("type") if isinstance(record, dict) else None
    if raw.complete and kind != "extension":  # extensions may be added to a finished recording
        raise RecordingError(f"{where} is corrupt: a record follows the end record", "record it again")
    try:
        if kind == "divergence.sequence":
            raw.sequences.append(SequenceRecord.from_json(record))
        elif kind == "recall.sample":
            raw.recall.append(_recall_sample(record))
        elif kind == "extension":
            name = record.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError("extension without a name")
            raw.extensions[name] = record.get("data")
        elif kind == "end":
            raw.complete = True
        else:
            raise ValueError(f"unknown record type {kind!r}")
    except (ValueError, TypeError, KeyError) as exc:
        raise RecordingError(
            f"{where} is corrupt: a {kind or 'typeless'} record before byte {end}: {exc}", "record it again"
        ) from None


_SAMPLE_FIELDS = {"conversation": str, "length": int, "depth": float, "key": str, "expected": str,
                  "answer": str, "correct": bool, "prompt_tokens": int}  # fmt: skip


def _recall_sample(record: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kind in _SAMPLE_FIELDS.items():
        value = record.get(name)
        ok = (
            isinstance(value, (int, float)) and not isinstance(value, bool)
            if kind is float
            else isinstance(value, kind)
        )
        if kind is int and isinstance(value, bool):
            ok = False
        if not ok:
            raise ValueError(f"field {name} is not a {kind.__name__}")
        out[name] = float(value) if kind is float and isinstance(value, (int, float)) else value
    return out


# -- writing -----------------------------------------------------------------------------------


class RecordingWriter:
    """Appends records, each as its own synced gzip member (an interrupted write loses only that record)."""

    def __init__(self, path: Path, header: dict[str, Any] | None, keep_bytes: int | None = None) -> None:
        self.path = path
        try:
            self._fh: BinaryIO
            if header is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = path.open("wb")
                self.write(header)
            else:
                self._fh = path.open("r+b")
                self._fh.truncate(keep_bytes)  # drop a record cut short by the interruption
                self._fh.seek(0, os.SEEK_END)
        except OSError as exc:
            raise UsageError(f"cannot write recording {str(path)!r}: {exc.strerror}", "pass a writable --out") from None

    def write(self, record: Mapping[str, Any]) -> None:
        if record.get("type") not in RECORD_TYPES:
            raise ValueError(f"not a record type: {record.get('type')!r}")
        data = gzip.compress(json.dumps(record, separators=(",", ":")).encode() + b"\n", compresslevel=9, mtime=0)
        try:
            self._fh.write(data)
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as exc:
            raise StoreError(f"cannot append to {str(self.path)!r}: {exc.strerror}", "free disk space") from None

    def close(self) -> None:
        self._fh.close()


def add_extension(path: Path, name: str, data: Any) -> None:
    """Append named optional data (e.g. ``floor``, a noise floor) to a recording, finished or not."""
    if not name:
        raise UsageError("an extension needs a name", "pass e.g. floor")
    parse_recording(Path(path).read_bytes(), str(path))  # only onto a readable recording
    writer = RecordingWriter(Path(path), None, Path(path).stat().st_size)
    try:
        writer.write({"type": "extension", "name": name, "data": data})
    finally:
        writer.close()
