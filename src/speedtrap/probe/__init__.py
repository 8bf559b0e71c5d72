"""Probes: planted-fact recall and teacher-forced divergence, in-process and over HTTP."""

from __future__ import annotations

from speedtrap._stats import wilson
from speedtrap.probe._backend import Backend, ChatAnswer, PromptLogprobs, TokenDist
from speedtrap.probe._conversations import Conversation, Fact, build_conversation
from speedtrap.probe._divergence import (
    BucketStats,
    DivergenceReport,
    DivergenceSettings,
    PhaseDivergence,
    arun_divergence,
    run_divergence,
)
from speedtrap.probe._engine import Engine, Generation, StepLogprobs, top_logprobs
from speedtrap.probe._floor import DEFAULT_MARGIN, NoiseFloor, load_floor
from speedtrap.probe._http import HttpBackend
from speedtrap.probe._inprocess import InProcessBackend
from speedtrap.probe._recall import RecallCell, RecallReport, RecallSample, RecallSettings, arun_recall, run_recall
from speedtrap.probe._record import (
    AgainstRecording,
    RecallComparison,
    aagainst,
    adivergence_against,
    arecall_against,
    arecord,
    check_identity,
    record,
    resolve_settings,
    run_against,
)
from speedtrap.probe._recording import Identity, Recording, backend_identity, read_recording
from speedtrap.probe._recording_format import FORMAT as RECORDING_FORMAT
from speedtrap.probe._recording_format import VERSION as RECORDING_VERSION
from speedtrap.probe._recording_format import RecordingError, add_extension
from speedtrap.probe._repeat import Finding, RepeatReport, RepeatSettings, arun_repeat, run_repeat
from speedtrap.probe._spec import ProbeSettings, settings_for
from speedtrap.probe._stats import KLStats

__all__ = [
    "DEFAULT_MARGIN",
    "RECORDING_FORMAT",
    "RECORDING_VERSION",
    "AgainstRecording",
    "Backend",
    "BucketStats",
    "ChatAnswer",
    "Conversation",
    "DivergenceReport",
    "DivergenceSettings",
    "Engine",
    "Fact",
    "Finding",
    "Generation",
    "HttpBackend",
    "Identity",
    "InProcessBackend",
    "KLStats",
    "NoiseFloor",
    "PhaseDivergence",
    "ProbeSettings",
    "PromptLogprobs",
    "RecallCell",
    "RecallComparison",
    "RecallReport",
    "RecallSample",
    "RecallSettings",
    "Recording",
    "RecordingError",
    "RepeatReport",
    "RepeatSettings",
    "StepLogprobs",
    "TokenDist",
    "aagainst",
    "add_extension",
    "adivergence_against",
    "arecall_against",
    "arecord",
    "arun_divergence",
    "arun_recall",
    "arun_repeat",
    "backend_identity",
    "build_conversation",
    "check_identity",
    "load_floor",
    "read_recording",
    "record",
    "resolve_settings",
    "run_against",
    "run_divergence",
    "run_recall",
    "run_repeat",
    "settings_for",
    "top_logprobs",
    "wilson",
]
