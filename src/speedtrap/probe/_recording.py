"""A recording, loaded: its identity and settings, and the checks that refuse a mismatched comparison.

The target's identity: the model name it serves (or the in-process target's name), a tokenizer
fingerprint (vocabulary size where known, and a hash of the token ids of a fixed chat message),
the server version where the API exposes one (``GET /version``), the API a server is asked through, and
a hash of the weights for in-process targets. Another tokenizer, model, API or weights, or other probe
settings, is an error naming the difference and the fix; another server version is allowed and noted.
A noise floor is read here too (:func:`load_floor`): from its JSON file or from a recording that holds one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap._errors import UsageError
from speedtrap.probe._backend import Backend
from speedtrap.probe._divergence import DivergenceSettings
from speedtrap.probe._floor import NoiseFloor
from speedtrap.probe._http import HttpBackend
from speedtrap.probe._inprocess import InProcessBackend
from speedtrap.probe._recall import RecallSettings
from speedtrap.probe._recording_format import RecordingError, SequenceRecord, parse_recording
from speedtrap.probe._results import RecallSample

NO_ENDPOINT = frozenset({400, 404, 405, 422, 501})  # what a server without an optional endpoint answers

FINGERPRINT_TEXT = (
    "speedtrap tokenizer fingerprint: The quick brown fox jumps over the lazy dog; 0123456789, "
    "naïve café, 東京, emoji 🙂, tabs\tand  double  spaces."
)
RECORD_FIX = "record the baseline again with this target and these settings (speedtrap record)"


@dataclass(frozen=True)
class Identity:
    """What a recording's numbers depend on besides the probe settings."""

    source: str  # "in-process" or "http"
    model: str
    tokenizer: str  # sha256 (16 hex) of the fingerprint message's token ids or pieces
    tokenizer_method: str  # "ids" (a tokenizer's ids) or "pieces" (a text-only server's echoed tokens)
    vocab_size: int | None = None
    server_version: str | None = None
    weights: str | None = None  # in-process: blake2b of the unpatched weights
    api: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source, "model": self.model, "tokenizer": self.tokenizer,
            "tokenizer_method": self.tokenizer_method, "vocab_size": self.vocab_size,
            "server_version": self.server_version, "weights": self.weights, "api": self.api,
        }  # fmt: skip

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Identity:
        def opt(key: str, kind: type) -> Any:
            value = data.get(key)
            if value is not None and not isinstance(value, kind):
                raise RecordingError(f"the recording's identity.{key} is not a {kind.__name__}", RECORD_FIX)
            return value

        for key in ("source", "model", "tokenizer", "tokenizer_method"):
            if not isinstance(data.get(key), str):
                raise RecordingError(f"the recording's identity lacks {key}", RECORD_FIX)
        return cls(
            data["source"], data["model"], data["tokenizer"], data["tokenizer_method"], opt("vocab_size", int),
            opt("server_version", str), opt("weights", str), opt("api", str),
        )  # fmt: skip


def weights_hash(model: Any) -> str:
    """blake2b of an in-process model's unpatched parameters and buffers (names, shapes, dtypes, bytes)."""
    import torch

    digest = hashlib.blake2b(digest_size=16)
    with model.patched(()), torch.inference_mode():
        for name, tensor in sorted(model.model.state_dict().items()):
            t = tensor.detach().cpu().contiguous()
            digest.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


async def backend_identity(backend: Backend, weights: bool = True) -> Identity:
    """The identity of the model behind ``backend`` (a few small requests for a server)."""
    message = [{"role": "user", "content": FINGERPRINT_TEXT}]
    rendered = await backend.render(message)
    if isinstance(rendered, str):
        tokens: list[Any] = (await backend.prompt_logprobs(rendered, 1)).tokens
        method = "pieces"
    else:
        tokens, method = [int(t) for t in rendered], "ids"
    fingerprint = hashlib.sha256(repr(tokens).encode()).hexdigest()[:16]
    if isinstance(backend, InProcessBackend):
        model = backend.model
        vocab = model.config.get("vocab_size")
        return Identity(
            "in-process", model.name, fingerprint, method, vocab if isinstance(vocab, int) else len(model.tokenizer),
            None, weights_hash(model) if weights else None,
        )  # fmt: skip
    version = None
    api = None
    if isinstance(backend, HttpBackend):
        api = backend.api
        data = await backend.request("GET", "/version", None, NO_ENDPOINT)
        if isinstance(data, dict) and isinstance(data.get("version"), str):
            version = data["version"]
    model_name = str(getattr(backend, "model", "") or backend.name)
    return Identity("http", model_name, fingerprint, method, None, version, None, api)


def identity_mismatch(recorded: Identity, current: Identity) -> UsageError | None:
    """The first difference that makes a comparison meaningless, as a one-line error (None if none)."""
    if recorded.source != current.source:
        return UsageError(
            f"the recording was made {'in-process' if recorded.source == 'in-process' else 'over HTTP'}, "
            f"the target is {'in-process' if current.source == 'in-process' else 'a server'} "
            "(decode is teacher-forced in-process, greedy over HTTP)",
            "record the baseline the same way as the target runs (speedtrap record --target ...)",
        )
    if recorded.model != current.model:
        return UsageError(
            f"the recording is of model {recorded.model!r}, the target serves {current.model!r}",
            f"pass --model {recorded.model}, or {RECORD_FIX}",
        )
    if recorded.api and current.api and recorded.api != current.api:
        return UsageError(
            f"the recording was asked through the {recorded.api!r} API, the target is asked through {current.api!r} "
            "(the two APIs tokenize and score differently)",
            f"set probe.api = {recorded.api!r} (or --api {recorded.api}), or {RECORD_FIX}",
        )
    if recorded.vocab_size and current.vocab_size and recorded.vocab_size != current.vocab_size:
        return UsageError(
            f"the recording's tokenizer has {recorded.vocab_size} tokens, the target's {current.vocab_size}",
            RECORD_FIX,
        )
    if recorded.tokenizer_method == current.tokenizer_method and recorded.tokenizer != current.tokenizer:
        return UsageError(
            f"the recording was made with another tokenizer (fingerprint {recorded.tokenizer}, "
            f"the target's {current.tokenizer})",
            RECORD_FIX,
        )
    if recorded.weights and current.weights and recorded.weights != current.weights:
        return UsageError(
            f"the recording was made with other weights (hash {recorded.weights[:12]}, the target's "
            f"{current.weights[:12]})",
            RECORD_FIX,
        )
    return None


def identity_notes(recorded: Identity, current: Identity) -> list[str]:
    if recorded.server_version and current.server_version and recorded.server_version != current.server_version:
        return [f"the recording was made with server version {recorded.server_version}, the target runs "
                f"{current.server_version}"]  # fmt: skip
    return []


def settings_mismatch(what: str, recorded: dict[str, Any], asked: dict[str, Any]) -> UsageError | None:
    """A difference between the recording's probe settings and the ones asked for, naming the field."""
    for key in sorted(set(recorded) | set(asked)):
        if recorded.get(key) != asked.get(key):
            return UsageError(
                f"the recording's {what} {key} is {recorded.get(key)!r}, this run asks for {asked.get(key)!r}",
                f"drop the option to use the recording's settings, or {RECORD_FIX}",
            )
    return None


@dataclass
class Recording:
    """A complete recording: identity, settings, the divergence sequences and recall samples."""

    path: str
    identity: Identity
    divergence: DivergenceSettings | None
    recall: RecallSettings | None
    sequences: list[SequenceRecord]
    samples: list[RecallSample]
    extensions: dict[str, Any] = field(default_factory=dict)  # e.g. "floor": a noise floor (issue 17)
    created: str = ""
    speedtrap: str = ""
    digest: str = ""  # sha256 of the file's bytes: part of an isolate trial's identity
    data: bytes = b""  # the file's bytes (shipped to Ray workers with the oracle's recipe)

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Recording:
        raw = parse_recording(data, where)
        if not raw.complete:
            state = "truncated" if raw.truncated else "incomplete"
            raise RecordingError(
                f"{where} is {state}: the recording was interrupted before its end",
                "finish it with the same speedtrap record command plus --resume, or record it again",
            )
        header = raw.header
        probes = header["probes"]
        try:
            div = probes.get("divergence")
            rec = probes.get("recall")
            divergence = DivergenceSettings.from_json(div) if div is not None else None
            recall = RecallSettings.from_json(rec) if rec is not None else None
            samples = [RecallSample.from_json(s) for s in raw.recall]
        except (KeyError, TypeError, ValueError, UsageError) as exc:
            raise RecordingError(f"{where} has invalid probe settings: {exc}", RECORD_FIX) from None
        identity = Identity.from_json(header["identity"])
        recording = cls(
            where, identity, divergence, recall, raw.sequences, samples, raw.extensions,
            str(header.get("created", "")), str(header.get("speedtrap", "")), hashlib.sha256(data).hexdigest(), data,
        )  # fmt: skip
        recording._check_counts(where)
        _ = recording.floor  # an invalid floor is found on load, not when a verdict needs it
        return recording

    def _check_counts(self, where: str) -> None:
        if self.divergence is not None:
            want = {(n, i) for n in self.divergence.lengths for i in range(self.divergence.sequences)}
            have = {s.key for s in self.sequences}
            if have != want or len(self.sequences) != len(want):
                raise RecordingError(f"{where} holds other divergence sequences than its settings name", RECORD_FIX)
        if self.recall is not None:
            want_n = len(self.recall.lengths) * len(self.recall.depths) * self.recall.samples
            if len({s.id for s in self.samples}) != want_n:
                raise RecordingError(f"{where} holds {len(self.samples)} recall samples, not {want_n}", RECORD_FIX)

    @property
    def floor(self) -> NoiseFloor | None:
        """The reference stack's noise floor, when it was stored with the recording (``record --floor``)."""
        data = self.extensions.get("floor")
        if data is None:
            return None
        try:
            return NoiseFloor.from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError):
            raise RecordingError(
                f"{self.path} holds an invalid noise floor", "store it again: speedtrap probe repeat --into FILE"
            ) from None

    @property
    def kinds(self) -> list[str]:
        return [k for k, s in (("divergence", self.divergence), ("recall", self.recall)) if s is not None]

    def summary(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "identity": self.identity.to_json(),
            "divergence": self.divergence.to_json() if self.divergence else None,
            "recall": self.recall.to_json() if self.recall else None,
            "sequences": len(self.sequences),
            "positions": sum(len(s.prefill.positions) + len(s.decode.positions) for s in self.sequences),
            "recall_samples": len(self.samples),
            "bytes": len(self.data),
            "sha256": self.digest,
            "extensions": sorted(self.extensions),
        }


def read_recording(path: Path) -> Recording:
    """Load and validate a complete recording; every problem is one line naming it and the fix."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise UsageError(f"no recording at {str(path)!r}", "pass the file written by speedtrap record --out") from None
    except OSError as exc:
        raise UsageError(f"cannot read recording {str(path)!r}: {exc.strerror}", "check the path") from None
    return Recording.from_bytes(data, str(path))


GZIP_MAGIC = b"\x1f\x8b"  # a recording (gzip JSON records), not a floor file


def load_floor(path: Path) -> NoiseFloor:
    """A floor from a file: the ``floor`` of ``speedtrap probe repeat --json`` output, the floor alone,
    or a recording that holds one (``speedtrap record --floor``, ``probe repeat --into``)."""
    try:
        if path.read_bytes()[:2] == GZIP_MAGIC:
            return _recorded_floor(path)
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(
            f"no noise floor file {path}", "write one with: speedtrap probe repeat --json > FILE"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"{path} is not a JSON noise floor ({exc})", "write it with speedtrap probe repeat --json"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("floor"), dict):
        data = data["floor"]
    try:
        return NoiseFloor.from_json(data)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise UsageError(f"{path} holds no noise floor", "write it with speedtrap probe repeat --json") from None


def _recorded_floor(path: Path) -> NoiseFloor:
    floor = read_recording(path).floor
    if floor is None:
        raise UsageError(
            f"the recording {path} holds no noise floor", f"store one: speedtrap probe repeat --into {path}"
        )
    return floor
