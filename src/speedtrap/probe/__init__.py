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
from speedtrap.probe._engine import Engine, Generation
from speedtrap.probe._floor import DEFAULT_MARGIN, NoiseFloor, load_floor
from speedtrap.probe._http import HttpBackend
from speedtrap.probe._inprocess import InProcessBackend
from speedtrap.probe._recall import RecallCell, RecallReport, RecallSample, RecallSettings, arun_recall, run_recall
from speedtrap.probe._repeat import Finding, RepeatReport, RepeatSettings, arun_repeat, run_repeat
from speedtrap.probe._stats import KLStats

__all__ = [
    "DEFAULT_MARGIN",
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
    "InProcessBackend",
    "KLStats",
    "NoiseFloor",
    "PhaseDivergence",
    "PromptLogprobs",
    "RecallCell",
    "RecallReport",
    "RecallSample",
    "RecallSettings",
    "RepeatReport",
    "RepeatSettings",
    "TokenDist",
    "arun_divergence",
    "arun_recall",
    "arun_repeat",
    "build_conversation",
    "load_floor",
    "run_divergence",
    "run_recall",
    "run_repeat",
    "wilson",
]
