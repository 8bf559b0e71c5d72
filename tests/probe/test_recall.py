"""The recall probe in-process: planted facts, the baseline's accuracy, the culprit's, resume."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from pathlib import Path

import pytest

from speedtrap._errors import UsageError
from speedtrap.probe import (
    ChatAnswer,
    InProcessBackend,
    RecallReport,
    RecallSettings,
    build_conversation,
    run_recall,
)
from speedtrap.targets._base import InProcessModel


def test_conversations_plant_facts_at_their_depths(smol: InProcessModel) -> None:
    async def count(messages: list[dict[str, str]]) -> int:
        return len(smol.chat_ids(messages))

    conv, tokens = asyncio.run(build_conversation("c", 700, (0.0, 0.5, 1.0), 11, count))
    again, _ = asyncio.run(build_conversation("c", 700, (0.0, 0.5, 1.0), 11, count))
    assert conv == again  # a seed fixes everything
    assert 600 < tokens <= 700
    roles = [m["role"] for m in conv.turns]
    assert roles[0] == "system" and all(a != b for a, b in itertools.pairwise(roles[1:]))
    values = [f.value for f in conv.facts]
    assert len(set(values)) == 3 and all(re.fullmatch(r"[1-9]\d{5}", v) for v in values)
    where = [next(i for i, m in enumerate(conv.turns) if f.value in m["content"]) for f in conv.facts]
    user_turns = len(conv.turns) - 1
    assert where[0] == 1 and where[2] >= user_turns - 2  # depth 0 first, depth 1 last
    assert where[0] < where[1] < where[2]
    last = conv.messages(conv.facts[0])[-1]
    assert last["role"] == "user" and conv.facts[0].key in last["content"]
    assert len(smol.chat_ids(conv.messages(conv.facts[1]))) <= 700


def test_baseline_recall_is_high_up_to_1024_tokens(grid_baseline: RecallReport) -> None:
    baseline = grid_baseline
    assert baseline.overall.n == 12
    assert baseline.overall.accuracy >= 0.9, [(s.id, s.expected, s.answer) for s in baseline.samples if not s.correct]
    longest = max(baseline.cells, key=lambda c: c.prompt_tokens)
    assert 900 < longest.prompt_tokens <= 1024
    for cell in baseline.cells:
        assert cell.n == 2 and cell.low <= cell.accuracy <= cell.high
    assert RecallReport.from_json(json.loads(json.dumps(baseline.to_json()))).to_json() == baseline.to_json()


@pytest.mark.slow
def test_the_double_application_is_visibly_lower(smol: InProcessModel, grid_baseline: RecallReport) -> None:
    """Facts told early in a 1,280-token conversation (the calibrated long length): the seed's symptom."""
    settings = RecallSettings(lengths=(1280,), depths=(0.1,), samples=4, seed=0)
    broken = run_recall(InProcessBackend(smol, ["hash_topk_routed_scaling"]), settings, progress=False)
    assert broken.overall.accuracy <= 0.25, broken.answers()
    assert grid_baseline.overall.accuracy - broken.overall.accuracy >= 0.6


class Interrupting:
    """A real backend that is interrupted (as by Ctrl-C) once ``after`` answers have come back (the
    in-process backend decodes the chats in flight together, so they come back together)."""

    def __init__(self, inner: InProcessBackend, after: int) -> None:
        self.inner, self.after, self.calls = inner, after, 0
        self.name = inner.name

    async def chat(self, messages: list[dict[str, str]], max_tokens: int) -> ChatAnswer:
        answer = await self.inner.chat(messages, max_tokens)
        if self.calls >= self.after:
            raise KeyboardInterrupt
        self.calls += 1
        return answer

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_an_interrupted_probe_keeps_its_samples_and_resumes(smol: InProcessModel, tmp_path: Path) -> None:
    settings = RecallSettings(lengths=(128,), depths=(0.2, 0.8), samples=2, seed=3, max_new_tokens=4)
    results = tmp_path / "recall.jsonl"
    first = Interrupting(InProcessBackend(smol), after=3)
    with pytest.raises(KeyboardInterrupt):
        run_recall(first, settings, results_path=results, progress=False)  # type: ignore[arg-type]
    lines = results.read_text().splitlines()
    assert len(lines) == 1 + 3  # header + the three finished samples
    with results.open("a") as fh:
        fh.write('{"conversation": "L128-s1-d0.8", "len')  # a line cut short by the crash
    with pytest.raises(UsageError, match="already exists"):
        run_recall(InProcessBackend(smol), settings, results_path=results, progress=False)
    other = RecallSettings(lengths=(128,), depths=(0.2, 0.8), samples=2, seed=4, max_new_tokens=4)
    with pytest.raises(UsageError, match="other settings"):
        run_recall(InProcessBackend(smol), other, results_path=results, resume=True, progress=False)
    second = Interrupting(InProcessBackend(smol), after=100)
    resumed = run_recall(second, settings, results_path=results, resume=True, progress=False)  # type: ignore[arg-type]
    assert second.calls == 1  # only the missing sample ran
    whole = run_recall(InProcessBackend(smol), settings, progress=False)
    assert resumed.answers() == whole.answers()
    assert resumed.overall == whole.overall


def test_settings_are_validated() -> None:
    with pytest.raises(UsageError, match="depths must lie"):
        RecallSettings(depths=(1.5,))
    with pytest.raises(UsageError, match="at least 64"):
        RecallSettings(lengths=(10,))
    quick = RecallSettings.quick()
    assert RecallSettings.from_json(quick.to_json()) == quick
    assert RecallSettings(lengths=[256], depths=[0.5]).lengths == (256,)  # type: ignore[arg-type]


def test_questions_sharing_a_prefix_compute_it_once(smol: InProcessModel) -> None:
    settings = RecallSettings(lengths=(160,), depths=(0.2, 0.5, 0.8), samples=1, shared_prefix=True, max_new_tokens=2)
    backend = InProcessBackend(smol)
    report = run_recall(backend, settings, progress=False)
    assert [s.conversation for s in report.samples] == ["L160-s0"] * 3
    assert len({s.key for s in report.samples}) == 3
    assert backend.engine.prefills == 1  # one conversation prefix, three questions
