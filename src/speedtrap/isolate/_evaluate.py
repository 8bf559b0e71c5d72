"""From configurations to verdicts: the trial store first, then the executor; repeats near the threshold.

A configuration's first trial is judged by the rule; if the call is "near", the configuration is
measured again (a new repeat number: probes draw new samples) up to ``repeats`` times, the
figures pooled, and a call still near the threshold ends *inconclusive*. Each trial is committed
to the store the moment it ends.

A stack that has shown itself deterministic (two trials of one configuration came back with exactly
the same figures) is not measured again: a repeat would return the same figures, so the call is
made from the figures pooled as that many identical trials (the verdict the repeats would have
given), rechecks are skipped, and :attr:`Evaluator.notes` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from speedtrap.isolate._executor import Executor, LocalExecutor, Oracle, TrialOutcome, TrialRequest
from speedtrap.isolate._results import Conclusion, Config, Judgement, Outcome, Trial
from speedtrap.isolate._rules import Rule
from speedtrap.isolate._store import TrialStore, trial_key


class Evaluator:
    """Judges batches of canonical configurations; counts trials run and reused."""

    def __init__(
        self,
        oracle: Oracle,
        rule: Rule,
        store: TrialStore,
        run_id: int,
        repeats: int = 2,
        retries: int = 0,
        executor: Executor | None = None,
        trial_dir: Path | None = None,
        on_trial: Callable[[Trial], None] | None = None,
    ) -> None:
        self.oracle = oracle
        self.rule = rule
        self.store = store
        self.run_id = run_id
        self.repeats = repeats
        self.retries = retries
        self.executor = executor or LocalExecutor()
        self.trial_dir = trial_dir
        self.on_trial = on_trial
        self.identity = oracle.identity()
        self.baseline: dict[str, float] | None = None
        self.trials: list[Trial] = []
        self.launches = 0
        self.reused = 0
        self.deterministic = ""  # why the stack counts as deterministic ("" until it has shown it)
        self.skipped = 0  # repeats and rechecks not launched because of that

    @property
    def capacity(self) -> int:
        return self.executor.capacity

    def __call__(self, configs: Sequence[Config]) -> list[Judgement]:
        return self.judge_many(configs)

    def judge_many(self, configs: Sequence[Config]) -> list[Judgement]:
        if self.baseline is None and () in configs and len(configs) > 1 and self.rule.needs_baseline:
            # A rule that compares with the baseline needs its figures before it can call the others.
            base = self.judge_many([()])[0]
            rest = dict(
                zip([c for c in configs if c != ()], self.judge_many([c for c in configs if c != ()]), strict=True)
            )
            return [base if c == () else rest[c] for c in configs]
        runs: dict[Config, list[Trial]] = {c: [] for c in configs}
        for repeat in range(self.repeats + 1):
            need = [c for c in configs if repeat == 0 or self._wants_repeat(c, runs[c])]
            if not need:
                break
            todo: list[TrialRequest] = []
            for c in need:
                stored = self.store.lookup(trial_key(self.identity, c, repeat))
                if stored is not None:
                    self._keep(runs, stored)
                    self.reused += 1
                else:
                    todo.append(self._request(c, repeat, len(todo)))
            for request, outcome in self.executor.run(todo, self.oracle, self.retries):
                trial = self.store.record(
                    trial_key(self.identity, request.config, request.repeat), self.run_id, self._trial(request, outcome)
                )
                self.launches += 1
                self._keep(runs, trial)
        return [self._verdict(c, runs[c]) for c in configs]

    def recheck(self, config: Config) -> Judgement:
        """Measure ``config`` again (new repeat numbers) until the pooled call is not near, or the
        repeats run out; pooled with its earlier trials."""
        trials = [t for t in self.trials if t.config == config and t.status == "ok"]
        if self.deterministic and trials:
            self.skipped += 1
            return self._verdict(config, trials)
        runs: dict[Config, list[Trial]] = {config: list(trials)}
        first = max((t.repeat for t in trials), default=-1) + 1
        for repeat in range(first, first + self.repeats + 1):
            if repeat > first and not self._wants_repeat(config, runs[config]):
                break
            stored = self.store.lookup(trial_key(self.identity, config, repeat))
            if stored is not None:
                self._keep(runs, stored)
                self.reused += 1
                continue
            for request, outcome in self.executor.run([self._request(config, repeat, 0)], self.oracle, self.retries):
                key = trial_key(self.identity, config, repeat)
                trial = self.store.record(key, self.run_id, self._trial(request, outcome))
                self.launches += 1
                self._keep(runs, trial)
            if runs[config][-1].status != "ok":
                break
        return self._verdict(config, runs[config])

    # ------------------------------------------------------------------------------------------

    def _request(self, config: Config, repeat: int, offset: int) -> TrialRequest:
        label = f"trial-{self.store.next_index() + offset:04d}"
        return TrialRequest(config, repeat, self.trial_dir, label)

    def _trial(self, request: TrialRequest, outcome: TrialOutcome) -> Trial:
        m = outcome.measurement
        figures = dict(m.figures) if m else {}
        single: Outcome | None = None
        if m is not None:
            single = self._call(request.config, [figures])
        return Trial(
            index=0,
            config=request.config,
            repeat=request.repeat,
            status="ok" if m else "failed",
            outcome=single,
            figures=figures,
            error=outcome.error,
            log_path=(m.log_path if m else outcome.log_path),
            report_path=m.report_path if m else None,
            attempts=outcome.attempts,
            started=outcome.started,
            finished=outcome.finished,
            launch_s=m.launch_s if m else 0.0,
            probe_s=m.probe_s if m else 0.0,
            run_id=self.run_id,
            stopped=(m.report or {}).get("stopped") if m else None,
        )

    @property
    def notes(self) -> list[str]:
        out = [f"{t.label()}: {t.stopped}" for t in self.trials if t.stopped]
        if not self.deterministic:
            return out
        return [
            *out,
            f"the stack is deterministic ({self.deterministic}): {self.skipped} repeat(s) and recheck(s) were not "
            "launched, each call made from its figures counted as the repeats it would have had",
        ]

    def _keep(self, runs: dict[Config, list[Trial]], trial: Trial) -> None:
        earlier = [t for t in runs[trial.config] if t.status == "ok"]
        runs[trial.config].append(trial)
        self.trials.append(trial)
        if not self.deterministic and trial.status == "ok" and any(t.figures == trial.figures for t in earlier):
            shown = ", ".join(f"{k}={v:.6g}" for k, v in sorted(trial.figures.items())[:3])
            name = "{" + ", ".join(trial.config) + "}" if trial.config else "the baseline"
            self.deterministic = f"two trials of {name} came back identical: {shown}"
        if self.on_trial is not None:
            self.on_trial(trial)

    def _call(self, config: Config, figures: list[dict[str, float]]) -> Outcome:
        pooled = self.rule.pool(figures)
        return self.rule.judge(pooled, None if not config else self.baseline)

    def _wants_repeat(self, config: Config, trials: list[Trial]) -> bool:
        if not trials or any(t.status != "ok" for t in trials):
            return False
        return not self.deterministic and self._call(config, [t.figures for t in trials]) is Outcome.NEAR

    def _implied(self, config: Config, figures: list[dict[str, float]]) -> list[dict[str, float]]:
        """On a deterministic stack, the figures the repeats would have returned: copies of the last."""
        if not self.deterministic or any(f != figures[-1] for f in figures):
            return figures
        more = list(figures)
        while len(more) <= self.repeats and self._call(config, more) is Outcome.NEAR:
            more.append(figures[-1])
        self.skipped += len(more) - len(figures)
        return more

    def _verdict(self, config: Config, trials: list[Trial]) -> Judgement:
        indices = tuple(t.index for t in trials)
        failed = [t for t in trials if t.status != "ok"]
        if failed:
            where = f"; read its log: {failed[-1].log_path}" if failed[-1].log_path else ""
            return Judgement(config, Conclusion.ERROR, {}, indices, f"{failed[-1].error}{where}")
        figures = self._implied(config, [t.figures for t in trials])
        pooled = self.rule.pool(figures)
        outcome = self.rule.judge(pooled, None if not config else self.baseline)
        if not config:
            self.baseline = pooled
        implied = len(figures) - len(trials)
        if implied:
            note = f"{implied} repeat(s) not launched (deterministic stack): the same figures counted again"
            if outcome is Outcome.NEAR:
                note = f"still near the threshold; {note}"
                return Judgement(config, Conclusion.INCONCLUSIVE, pooled, indices, note)
            return Judgement(config, Conclusion(outcome.value), pooled, indices, note)
        if outcome is Outcome.NEAR:
            note = f"still near the threshold after {len(trials)} trial{'s' if len(trials) > 1 else ''}"
            return Judgement(config, Conclusion.INCONCLUSIVE, pooled, indices, note)
        return Judgement(config, Conclusion(outcome.value), pooled, indices)
