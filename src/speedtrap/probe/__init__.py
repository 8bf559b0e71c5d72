"""Probes: planted-fact recall and teacher-forced divergence, in-process and over HTTP.

The result types (a recall cell, a divergence phase, the KL summary) load at once and load no probe
machinery; the probes, backends and recordings (torch, httpx) load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from speedtrap._lazy import lazy_getattr
from speedtrap._stats import wilson
from speedtrap.probe._results import (
    BucketStats,
    LengthStop,
    PhaseDivergence,
    RecallCell,
    RecallSample,
    flatten_figures,
)
from speedtrap.probe._stats import KLStats

if TYPE_CHECKING:
    from speedtrap.probe._backend import Backend, ChatAnswer, PromptLogprobs, TokenDist
    from speedtrap.probe._conversations import Conversation, Fact, build_conversation
    from speedtrap.probe._divergence import (
        DivergenceReport,
        DivergenceSettings,
        arun_divergence,
        divergence_figures,
        run_divergence,
    )
    from speedtrap.probe._divergence_stop import DivergenceGoal
    from speedtrap.probe._engine import Engine, Generation, StepLogprobs, top_logprobs
    from speedtrap.probe._floor import DEFAULT_MARGIN, NoiseFloor
    from speedtrap.probe._http import HttpBackend
    from speedtrap.probe._inprocess import InProcessBackend
    from speedtrap.probe._recall import RecallReference, RecallReport, RecallSettings, arun_recall, run_recall
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
    from speedtrap.probe._recording import Identity, Recording, backend_identity, load_floor, read_recording
    from speedtrap.probe._recording_format import FORMAT as RECORDING_FORMAT
    from speedtrap.probe._recording_format import VERSION as RECORDING_VERSION
    from speedtrap.probe._recording_format import RecordingError, add_extension
    from speedtrap.probe._repeat import Finding, RepeatReport, RepeatSettings, arun_repeat, run_repeat
    from speedtrap.probe._sequential import Sprt
    from speedtrap.probe._spec import ProbeSettings, settings_for

__all__ = [
    "DEFAULT_MARGIN",
    "RECORDING_FORMAT",
    "RECORDING_VERSION",
    "AgainstRecording",
    "Backend",
    "BucketStats",
    "ChatAnswer",
    "Conversation",
    "DivergenceGoal",
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
    "LengthStop",
    "NoiseFloor",
    "PhaseDivergence",
    "ProbeSettings",
    "PromptLogprobs",
    "RecallCell",
    "RecallComparison",
    "RecallReference",
    "RecallReport",
    "RecallSample",
    "RecallSettings",
    "Recording",
    "RecordingError",
    "RepeatReport",
    "RepeatSettings",
    "Sprt",
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
    "divergence_figures",
    "flatten_figures",
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

# The rest loads on first use, so that reading the result types loads neither torch nor httpx.
_LAZY = {
    "AgainstRecording": "speedtrap.probe._record",
    "Backend": "speedtrap.probe._backend",
    "ChatAnswer": "speedtrap.probe._backend",
    "Conversation": "speedtrap.probe._conversations",
    "DEFAULT_MARGIN": "speedtrap.probe._floor",
    "DivergenceGoal": "speedtrap.probe._divergence_stop",
    "DivergenceReport": "speedtrap.probe._divergence",
    "DivergenceSettings": "speedtrap.probe._divergence",
    "Engine": "speedtrap.probe._engine",
    "Fact": "speedtrap.probe._conversations",
    "Finding": "speedtrap.probe._repeat",
    "Generation": "speedtrap.probe._engine",
    "HttpBackend": "speedtrap.probe._http",
    "Identity": "speedtrap.probe._recording",
    "InProcessBackend": "speedtrap.probe._inprocess",
    "NoiseFloor": "speedtrap.probe._floor",
    "ProbeSettings": "speedtrap.probe._spec",
    "PromptLogprobs": "speedtrap.probe._backend",
    "RECORDING_FORMAT": "speedtrap.probe._recording_format:FORMAT",
    "RECORDING_VERSION": "speedtrap.probe._recording_format:VERSION",
    "RecallComparison": "speedtrap.probe._record",
    "RecallReference": "speedtrap.probe._recall",
    "RecallReport": "speedtrap.probe._recall",
    "RecallSettings": "speedtrap.probe._recall",
    "Recording": "speedtrap.probe._recording",
    "RecordingError": "speedtrap.probe._recording_format",
    "RepeatReport": "speedtrap.probe._repeat",
    "RepeatSettings": "speedtrap.probe._repeat",
    "Sprt": "speedtrap.probe._sequential",
    "StepLogprobs": "speedtrap.probe._engine",
    "TokenDist": "speedtrap.probe._backend",
    "aagainst": "speedtrap.probe._record",
    "add_extension": "speedtrap.probe._recording_format",
    "adivergence_against": "speedtrap.probe._record",
    "arecall_against": "speedtrap.probe._record",
    "arecord": "speedtrap.probe._record",
    "arun_divergence": "speedtrap.probe._divergence",
    "divergence_figures": "speedtrap.probe._divergence",
    "arun_recall": "speedtrap.probe._recall",
    "arun_repeat": "speedtrap.probe._repeat",
    "backend_identity": "speedtrap.probe._recording",
    "build_conversation": "speedtrap.probe._conversations",
    "check_identity": "speedtrap.probe._record",
    "load_floor": "speedtrap.probe._recording",
    "read_recording": "speedtrap.probe._recording",
    "record": "speedtrap.probe._record",
    "resolve_settings": "speedtrap.probe._record",
    "run_against": "speedtrap.probe._record",
    "run_divergence": "speedtrap.probe._divergence",
    "run_recall": "speedtrap.probe._recall",
    "run_repeat": "speedtrap.probe._repeat",
    "settings_for": "speedtrap.probe._spec",
    "top_logprobs": "speedtrap.probe._engine",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
