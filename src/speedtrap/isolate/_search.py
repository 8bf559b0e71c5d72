"""The search: every 1-minimal failing set of patches, in few trials, with interactions named.

Every configuration goes through one gate, :meth:`Search.consider`: it canonicalizes the set
(sorted, requirements added, conflicts skipped), answers from this run's memo, and otherwise asks
the judge (which checks the trial store, then runs the probe). The passes are plain data flow:

1. the baseline must pass and the full set must fail (else say so and stop);
2. discovery: in a failing context, a binary search over prefixes finds the first patch whose
   addition makes it fail; that patch is kept and the search repeats among the patches before it
   until the kept set fails alone (QuickXplain-style; a single culprit costs ceil(log2 n) + 1
   trials). Further minimal sets are searched in the complement of each minimal hitting set of
   the sets found so far (for singletons: everything but the culprits), until those all pass;
3. checks: each set of two or more patches is tested without each of its members (fails only
   together = a *joint* interaction); each set is tested among all non-culprit patches (passes
   there = *masked*: other patches fix it, which are then found); each pair of sets is tested
   together among the rest (passes = *cancel*: correct only together, not two culprits).

The plan (``plan="auto"``): with capacity 1 and up to 64 patches, every trial inside a failing
context is the one a minimax table picks (``_policy``: the patch alone or a prefix, from how many
patches of the span and after it are still unknown and how many culprits are found). The table
keeps, for up to three single culprits on a monotone stack, every placement within the naive
plan's count: the baseline, the full set, every patch alone, then what the conclusion needs
(everything but the culprits, and with two or more sets each set among the rest and each pair
among the rest); the contexts this search tests between culprits are among those checks. For
n >= 11 a single culprit costs ceil(log2 n) + 1 trials besides those, as bisection does; for
n <= 9 the table's worst case for one culprit is n (the naive plan's), because no plan can keep
three culprits within the naive count otherwise, of the plans that test patches alone and
prefixes (the module ``_policy`` says why). With capacity
above 1 (several trials per round) or more patches, the *bisect* plan: split points by prior
weight, and patches alone inside a span of r patches once at most ceil(log2 r) + 1 of them are
untested. The *singles* plan scans every failing context one patch at a time. A patch measured
to fail alone is never bisected for; a span whose unknown patches all pass alone (a set that
fails only together) is bisected by position. benchmarks/bench_isolate.py measures the plans
against the naive plan, ddmin and the search before issue 17.

Discovery stops at ``max_trials`` configurations (3n + 30 per trial slot): verdicts that contradict
each other (noise near the bound, or a stack with countless minimal sets) would otherwise keep it
finding new "sets"; the result then says so and the interaction checks are skipped.

A *commit window* (``history=True``: the patches are the commits of a linear history base..HEAD,
in that order) is searched like ``git bisect``, because a prefix of a history always applies and
a subset of its commits cherry-picked onto the base need not: a binary search over the prefixes
finds the first commit at which the window fails (prefix k-1 passes, prefix k fails); the ends
(the base, HEAD) are measured only when the search reaches them, as ``git bisect`` is told them.
Then that commit alone on the base: it fails (a single culprit), or it passes (it fails only with
earlier commits: those are found by the same bisection over the earlier commits' prefixes with it
added, and the set is tested alone), or it does not apply alone (said so). A culprit on the last
commit costs one launch more (HEAD's); every other costs at most ceil(log2 N) + 1 launches. As
``git bisect``, the hunt names the first failing commit and does not search the commits after it.

Pass verdicts are extended to subsets (monotonicity) only to skip trials inside discovery; the
checks in step 3 test the configurations that monotonicity would otherwise assume. With capacity
above 1 the bisection tests several split points per round; with capacity 1 it tests exactly one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from speedtrap._errors import UsageError
from speedtrap.isolate._policy import MAX_PATCHES, policy_for
from speedtrap.isolate._relations import Relations, minimal_transversals
from speedtrap.isolate._results import (
    Conclusion,
    Config,
    CulpritSet,
    Interaction,
    InteractionKind,
    IsolateResult,
    Judgement,
    Status,
)

PLANS = ("auto", "table", "bisect", "singles")

Judge = Callable[[Sequence[Config]], list[Judgement]]
Ahead = Callable[[list[str]], list[list[str]]]
Wanted = Callable[[Judgement], bool]


@dataclass
class SearchProgress:
    suspects_left: int
    total: int
    found: int
    phase: str


class Search:
    def __init__(
        self,
        patches: Sequence[str],
        judge: Judge,
        relations: Relations | None = None,
        prior: Sequence[str] = (),
        capacity: int = 1,
        check_interactions: bool = True,
        progress: Callable[[SearchProgress], None] | None = None,
        recheck: Callable[[Config], Judgement] | None = None,
        plan: str = "auto",
        max_trials: int | None = None,
        history: bool = False,
    ) -> None:
        if plan not in PLANS:
            raise UsageError(f"search plan must be one of {', '.join(PLANS)}, got {plan!r}", "pass plan='auto'")
        self.relations = relations or Relations()
        self._judge = judge
        self._recheck = recheck
        self.capacity = max(1, capacity)
        self.check_interactions = check_interactions
        self._progress = progress
        self.memo: dict[Config, Judgement] = {}
        self.considered: list[Judgement] = []
        self.notes: list[str] = []
        self.history = history
        if history:  # a commit window: its history order is what makes every prefix apply
            if prior:
                self.notes.append("search.prior is not used on a commit window: its history order is bisected")
            prior = ()
            plan = "bisect"
        self.order, self.not_searched = self.relations.plan(patches, prior)
        ranks = {name: i for i, name in enumerate(self.order)}
        self.weights = {n: 1.0 / (ranks[n] + 1) ** 2 if prior else 1.0 for n in self.order}
        self._pos = ranks
        self._found = 0
        self.plan = _pick_plan(len(self.order), self.capacity) if plan == "auto" else plan
        self._policy = policy_for(len(self.order), bool(prior)) if self.plan == "table" else None
        self._spent = 0  # trials the table's plan has made (patches alone and prefixes)
        # Discovery stops at this many configurations (noisy verdicts that contradict each other can
        # otherwise send it after ever more "sets"); the checks of what it found still run.
        # With spare slots, look-ahead configurations fill the memo too: the limit counts rounds' worth.
        self.max_trials = max_trials if max_trials is not None else (3 * len(self.order) + 30) * self.capacity
        self._discovering = False
        if self.plan == "table" and self._policy is None:
            self.plan = "bisect"

    # ------------------------------------------------------------------------------------------
    # The one gate.

    def canonical(self, config: Iterable[str]) -> Config:
        return tuple(sorted(self.relations.closure(config)))

    def consider(self, config: Iterable[str]) -> Judgement:
        return self.consider_many([config])[0]

    def consider_many(self, configs: Sequence[Iterable[str]]) -> list[Judgement]:
        """Canonicalize, skip impossible ones, answer from the memo, judge the rest in batches."""
        canon = [self.canonical(c) for c in configs]
        todo: list[Config] = []
        for c in canon:
            if c in self.memo or c in todo:
                continue
            clash = self.relations.conflict(frozenset(c))
            if clash is not None:
                self._remember(Judgement(c, Conclusion.SKIPPED, note=f"{clash[0]} conflicts with {clash[1]}"))
            else:
                todo.append(c)
        if todo and self._discovering and len(self.memo) >= self.max_trials:
            raise _OverBudget
        for start in range(0, len(todo), self.capacity):
            for judgement in self._judge(todo[start : start + self.capacity]):
                self._remember(judgement)
        return [self.memo[c] for c in canon]

    def consider_ahead(self, needed: Sequence[Iterable[str]], ahead: Sequence[Iterable[str]]) -> list[Judgement]:
        """Judge ``needed``; with capacity above 1, the spare slots of its last batch take ``ahead``.

        ``ahead`` are configurations the search will likely ask next (the next bisection's split
        points, the next context): on a cluster they cost no extra round, and the passes read
        their verdicts from the memo. With capacity 1 this is exactly ``consider_many(needed)``.
        """
        if self.capacity > 1:
            fresh = list(dict.fromkeys(c for c in map(self.canonical, needed) if c not in self.memo))
            spare = (-len(fresh)) % self.capacity if fresh else 0
            extra: list[Config] = []
            for c in map(self.canonical, ahead):
                if len(extra) >= spare:
                    break
                if c not in self.memo and c not in fresh and c not in extra:
                    extra.append(c)
            self.consider_many([*fresh, *extra])
        return self.consider_many(needed)

    def _remember(self, judgement: Judgement) -> None:
        self.memo[judgement.config] = judgement
        self.considered.append(judgement)

    # ------------------------------------------------------------------------------------------
    # The passes.

    def run(self) -> IsolateResult:
        order = self.order
        if not order:
            return self._stop(Status.FULL_PASSES, "no patch can be switched: nothing to search")
        if self.history:
            return self._run_window(order)
        # With spare slots: the full set, then single patches (likely suspects first) in the same round.
        base = self.consider_ahead([()], [order, *([p] for p in order)])[0]
        if base.verdict is not Conclusion.PASS:
            if base.verdict is Conclusion.FAIL:
                return self._stop(Status.BASELINE_FAILS, "the baseline (no patch on) already fails: no patch to blame")
            why = f" ({base.note})" if base.note else ""
            return self._stop(
                _status(base.verdict), f"the baseline's verdict is {base.verdict.value}: cannot search{why}"
            )
        full = self.consider(order)
        if full.verdict is Conclusion.PASS:
            return self._stop(Status.FULL_PASSES, "the full set of patches does not fail: nothing to isolate")
        if full.verdict is not Conclusion.FAIL:
            why = f" ({full.note})" if full.note else ""
            return self._stop(
                _status(full.verdict), f"the full set's verdict is {full.verdict.value}: cannot search{why}"
            )
        found: list[Config] = []
        self._discovering = True
        try:
            self._discover(order, found)
        except _OverBudget:
            self.notes.append(
                f"stopped searching after {len(self.memo)} configurations (the limit): "
                "the verdicts may contradict each other (noise near the bound?); more culprit sets may remain, "
                "and the interaction checks were skipped"
            )
            self.check_interactions = False
        finally:
            self._discovering = False
        return self._conclude(order, found)

    def _run_window(self, order: list[str]) -> IsolateResult:
        """A commit window, as ``git bisect`` does it: the first failing prefix, then its last commit alone."""
        n = len(order)
        prefix = [self.canonical(order[:i]) for i in range(n + 1)]
        lo, hi = 0, n  # prefix lo passes and prefix hi fails, once the ends are measured
        while hi - lo > 1:
            self._report(hi - lo, "bisect")
            mid = (lo + hi) // 2
            verdict = self.consider(prefix[mid]).verdict
            if verdict is Conclusion.FAIL:
                hi = mid
            elif verdict is Conclusion.PASS:
                lo = mid
            else:
                why = self.memo[prefix[mid]].note
                return self._stop(
                    _status(verdict),
                    f"the window's first {mid} commit(s) (up to {order[mid - 1]}) are {verdict.value}"
                    f"{f' ({why})' if why else ''}: the bisection cannot go on",
                )
        if lo == 0:
            base = self.consider(()).verdict
            if base is Conclusion.FAIL:
                return self._stop(Status.BASELINE_FAILS, "the baseline (no patch on) already fails: no patch to blame")
            if base is not Conclusion.PASS:
                return self._stop(_status(base), f"the baseline's verdict is {base.value}: cannot search")
        if hi == n:
            head = self.consider(prefix[n]).verdict
            if head is Conclusion.PASS:
                return self._stop(Status.FULL_PASSES, "the full set of patches does not fail: nothing to isolate")
            if head is not Conclusion.FAIL:
                return self._stop(_status(head), f"the full set's verdict is {head.value}: cannot search")
        first = order[hi - 1]
        where = f"{first} is the first commit at which the window fails (the {hi - 1} before it pass, with it: fail)"
        alone = self.consider([first])
        if alone.verdict is Conclusion.FAIL:
            return self._finish([CulpritSet((first,), True, f"fails alone on the base; {where}")], [])
        if alone.verdict is Conclusion.SKIPPED:
            note = f"{where}; it does not cherry-pick onto the base without earlier commits, so it is not tested alone"
            self.notes.append(note)
            return self._finish([CulpritSet((first,), True, note)], [])
        if alone.verdict is not Conclusion.PASS:
            note = f"{where}; alone on the base its verdict is {alone.verdict.value}"
            return self._finish([CulpritSet((first,), True, note)], [])
        # It passes alone: it fails only with earlier commits. Bisect their prefixes with it added.
        earlier = order[: hi - 1]
        try:
            partners = self._minimal([first], earlier, _fails, infer=False) or []
        except _OverBudget:
            partners = []
        m = self.canonical([first, *partners])
        if partners and self.consider(m).verdict is Conclusion.FAIL:
            names = sorted(m, key=self._pos.__getitem__)
            others = [x for x in names if x != first]
            note = (
                f"the set fails on the base; {where}, and passes alone: it fails only with {' + '.join(others)} "
                f"(each earlier one is in the passing first {hi - 1} commits)"
            )
            joint = Interaction(
                InteractionKind.JOINT,
                m,
                (m,),
                (self.canonical([first]),),
                f"{' + '.join(names)} fail only together: {first} alone passes, and so do the earlier commits",
            )
            return self._finish([CulpritSet(m, True, note)], [joint])
        note = (
            f"{where}; alone on the base it passes: it fails only with earlier commits, which could not be "
            "narrowed (their subsets with it do not cherry-pick onto the base, or do not fail)"
        )
        self.notes.append(note)
        return self._finish(
            [CulpritSet((first,), False, note)], [], Status.INCONCLUSIVE, f"first failing commit: {first} ({note})"
        )

    def _discover(self, order: list[str], found: list[Config]) -> None:
        """Append every minimal failing set found to ``found`` (kept there if the trial limit stops it)."""
        for _ in range(2 * len(order) + 2):
            contexts = []
            for hitting in minimal_transversals([set(m) for m in found], self._pos):
                ctx = self._without(order, hitting)
                if ctx and ctx not in contexts:
                    contexts.append(ctx)
            if contexts and self.capacity > 1:  # one at a time otherwise: the first new set ends the round
                first = contexts[0]
                self.consider_ahead(contexts, [first[:p] for p in self._split_points(first, 0, len(first))])
            new = None
            for ctx in contexts:
                verdict = self.consider(ctx).verdict
                if verdict.bad:
                    # Follow clean fails; only a context that is itself inconclusive is searched for
                    # the inconclusive patches in it (reported unconfirmed).
                    wanted = _fails if verdict is Conclusion.FAIL else _bad
                    # A patch of the context already measured to fail alone is a minimal set: no bisection.
                    found_set = self._failing_single(ctx, found) if wanted is _fails else None
                    if found_set is None and wanted is _fails and self.plan == "singles":
                        single = self._scan_singles(ctx)  # None: no patch fails alone, bisection finds the set
                        found_set = [single] if single is not None else None
                    if found_set is None:
                        then = functools.partial(self._next_round, found)
                        found_set = self._minimal([], ctx, wanted, infer=True, then=then)
                    if found_set is None:
                        continue
                    m = self.canonical(found_set)
                    if self._confirmed(m):  # test what inference assumed, before it can mislead the next round
                        m = self._ensure_one_minimal(m)
                    if m in found:
                        self.notes.append(f"search met {{{', '.join(m)}}} twice: the verdicts are not monotone")
                        continue
                    new = m
                    break
            if new is None:
                return
            found.append(new)
            self._found = len(found)
        self.notes.append("stopped after the round limit: there may be more culprit sets")

    def _failing_single(self, ctx: list[str], found: list[Config]) -> list[str] | None:
        for p in ctx:
            j = self.memo.get(self.canonical([p]))
            if j is not None and j.verdict is Conclusion.FAIL and j.config not in found:
                return [p]
        return None

    def _next_round(self, found: list[Config], m: Iterable[str]) -> list[list[str]]:
        """What discovery tests first once ``m`` joins ``found``: the next context and its split points."""
        hitting = minimal_transversals([set(x) for x in [*found, tuple(m)]], self._pos)
        ctx = self._without(self.order, hitting[0]) if hitting else []
        return [ctx, *(ctx[:p] for p in self._split_points(ctx, 0, len(ctx)))] if ctx else []

    def _minimal(
        self, base: list[str], cands: list[str], wanted: Wanted, infer: bool, then: Ahead | None = None
    ) -> list[str] | None:
        """A minimal X of ``cands`` with base+X wanted, given base+cands wanted and base not.

        In culprit mode, a set that turns out to need two or more patches is first re-measured once
        (when the judge can re-measure and the fail rests on one trial): one noisy fail would
        otherwise send the search after a "minimal set" of many patches. If the fail does not hold,
        the search starts over with the corrected verdict; None when ``base+cands`` itself passes.
        """
        for _ in range(len(cands) + 1):
            try:
                return self._minimal_once(base, cands, wanted, infer, then)
            except _Evaporated:
                if not wanted(self.consider(base + cands)):
                    return None
        return None

    def _minimal_once(
        self, base: list[str], cands: list[str], wanted: Wanted, infer: bool, then: Ahead | None = None
    ) -> list[str]:
        kept: list[str] = []
        rest = list(cands)
        while rest:
            if kept:
                trial = base + kept
                if not (infer and self._known_pass(trial)):
                    # Spare slots: what comes next if ``kept`` is the answer, then if it is not.
                    done = then(kept) if then is not None else []
                    more = [base + kept + rest[:p] for p in self._split_points(rest, 0, len(rest))]
                    if wanted(self.consider_ahead([trial], _interleave(done, more))[0]):
                        return kept
                if infer and self._recheck_flips(base + kept + rest, wanted):
                    raise _Evaporated
            lo = min(self._known_prefix(base + kept, rest), len(rest) - 1) if infer else 0
            hi = self._bisect(base + kept, rest, lo, len(rest), wanted, infer)
            kept.append(rest[hi - 1])
            rest = rest[: hi - 1]
        return kept

    def _bisect(self, base: list[str], cands: list[str], lo: int, hi: int, wanted: Wanted, infer: bool) -> int:
        """Smallest i with base+cands[:i] wanted, knowing it is not at lo and is at hi."""
        while hi - lo > 1:
            lo, hi = self._narrow(base, cands, lo, hi, wanted)
            if hi - lo <= 1:
                break
            self._report(hi - lo, "bisect")
            if infer and not base and self._policy is not None:
                step = self._table_step(cands, lo, hi)
                if step is None:
                    pass  # every patch of the span passes alone: a set that fails only together, by position
                elif step[0] == "culprit":
                    return step[1]
                elif step[0] == "pass":
                    continue
                else:
                    point = step[1]
                    if wanted(self.consider(base + cands[:point])):
                        hi = point
                    else:
                        lo = point
                    continue
            if infer and not base and self.plan == "bisect" and self._singles_pay(cands[lo:hi]):
                single = self._scan_singles(cands[lo:hi])
                if single is not None:
                    return cands.index(single) + 1
            points = self._split_points(cands, lo, hi)
            if infer:
                known = [p for p in points if self._known_pass(base + cands[:p])]
                if known:
                    lo = max(known)
                    continue
            judgements = self.consider_many([base + cands[:p] for p in points])
            hit = [p for p, j in zip(points, judgements, strict=True) if wanted(j)]
            hi = min([*hit, hi])
            lo = max([p for p, j in zip(points, judgements, strict=True) if not wanted(j) and p < hi] + [lo])
        self._report(1, "bisect")
        return hi

    def _table_step(self, cands: list[str], lo: int, hi: int) -> tuple[str, int] | None:
        """One trial the minimax table picks inside the failing span ``cands[lo:hi]``.

        ("culprit", i): cands[i - 1] failed alone; ("pass", 0): the patch tested alone passed;
        ("point", p): the table wants the prefix cands[:p] tested (the caller tests it); None: no
        patch of the span has an unknown verdict alone.
        """
        assert self._policy is not None
        unknown = set(self._untested_singles(cands))
        span = [i for i in range(lo, hi) if cands[i] in unknown]
        if not span:
            return None
        after = sum(1 for i in range(hi, len(cands)) if cands[i] in unknown)
        weights = [self.weights.get(cands[i], 1.0) for i in span]
        s = self._policy.step(len(span), after, self._found, self._spent, weights)
        self._spent += 1
        if s <= 1 or len(span) == 1:
            first = cands[span[0]]
            if self.consider([first]).verdict is Conclusion.FAIL:
                return ("culprit", span[0] + 1)
            return ("pass", 0)
        return ("point", span[s - 1] + 1)

    def _singles_pay(self, span: list[str]) -> bool:
        """Whether testing ``span``'s patches alone costs no more trials than bisecting it and confirming.

        Bisection spends about ceil(log2 r) + 1 trials on a span of r patches (the split points, then the
        culprit alone), and its split points are of no use to anything else; a patch tested alone is
        a trial the one-at-a-time plan makes too, and a failing one needs no confirmation.
        """
        todo = self._untested_singles(span)
        return len(todo) <= math.ceil(math.log2(len(span))) + 1

    def _untested_singles(self, span: list[str]) -> list[str]:
        """Patches of ``span`` whose verdict alone is neither measured nor implied by a measured pass."""
        return [p for p in span if self.canonical([p]) not in self.memo and not self._known_pass([p])]

    def _scan_singles(self, span: list[str]) -> str | None:
        """The first patch of ``span`` that fails alone (one per trial, or ``capacity`` per round)."""
        for p in span:
            j = self.memo.get(self.canonical([p]))
            if j is not None and j.verdict is Conclusion.FAIL:
                return p
        todo = self._untested_singles(span)
        for start in range(0, len(todo), self.capacity):
            self._report(len(todo) - start, "singles")
            batch = todo[start : start + self.capacity]
            for p, j in zip(batch, self.consider_many([[p] for p in batch]), strict=True):
                if j.verdict is Conclusion.FAIL:
                    return p
        return None

    def _narrow(self, base: list[str], cands: list[str], lo: int, hi: int, wanted: Wanted) -> tuple[int, int]:
        """The range (lo, hi) after what the memo already says of the prefixes in it (speculated ones)."""
        known = [(i, self.memo.get(self.canonical(base + cands[:i]))) for i in range(lo + 1, hi)]
        hit = [i for i, j in known if j is not None and wanted(j)]
        hi = min([*hit, hi])
        lo = max([i for i, j in known if j is not None and not wanted(j) and i < hi] + [lo])
        return lo, hi

    def _split_points(self, cands: list[str], lo: int, hi: int) -> list[int]:
        """``capacity`` split points in (lo, hi) that cut the suspects' prior weight into equal parts."""
        span = cands[lo:hi]
        total = sum(self.weights.get(c, 1.0) for c in span)
        points: list[int] = []
        for k in range(1, self.capacity + 1):
            target, acc = total * k / (self.capacity + 1), 0.0
            for i, c in enumerate(span, start=1):
                acc += self.weights.get(c, 1.0)
                if acc >= target - 1e-12:
                    point = min(max(lo + i, lo + 1), hi - 1)
                    if point not in points:
                        points.append(point)
                    break
        return sorted(points) or [lo + 1]

    def _conclude(self, order: list[str], found: list[Config]) -> IsolateResult:
        # Sets whose own verdict is not a clean fail are reported as they are (unconfirmed): refining
        # or cross-checking a set the probe cannot call would spend trials on noise.
        sets = list(dict.fromkeys(found))
        checked = [m for m in sets if self._confirmed(m)]
        interactions: list[Interaction] = []
        for m in checked:
            if len(m) >= 2 and not any(self.relations.closure([x]) == set(m) for x in m):
                without = [tuple(x for x in m if x != y) for y in m]
                interactions.append(
                    Interaction(
                        InteractionKind.JOINT,
                        m,
                        (m,),
                        tuple(without),
                        f"{' + '.join(m)} fail only together: each one alone passes",
                    )
                )
        removed: set[Config] = set()
        if self.check_interactions and checked:
            self._report(0, "checks")
            contexts = {m: self.canonical(self._context(order, sets, [m])) for m in checked}
            if self.capacity > 1:  # the checks below packed into full rounds (exact when no set is masked)
                pairs = [(a, b) for i, a in enumerate(checked) for b in checked[i + 1 :]]
                pairs_ahead = [self._context(order, checked, list(pair)) for pair in pairs]
                fixed_ahead = self._without(order, {p for m in sets for p in m})
                self.consider_many([*contexts.values(), *pairs_ahead, fixed_ahead])
            self.consider_many(list(contexts.values()))
            for m in checked:
                if self.consider(contexts[m]).verdict is Conclusion.PASS:
                    rest = [p for p in order if p in contexts[m] and p not in m]
                    fixers = self.canonical(self._minimal(list(m), rest, _passes, infer=False) or rest)
                    both = self.canonical([*m, *fixers])
                    interactions.append(
                        Interaction(
                            InteractionKind.MASKED,
                            both,
                            (m,),
                            (both,),
                            f"{' + '.join(m)} fails without {' + '.join(fixers)}, and passes with it: "
                            "correct only together, not a culprit in this deployment",
                        )
                    )
                    removed.add(m)
            live = [m for m in checked if m not in removed]
            pairs = [(a, b) for i, a in enumerate(live) for b in live[i + 1 :]]
            pair_ctx = {pair: self.canonical(self._context(order, live, list(pair))) for pair in pairs}
            self.consider_many(list(pair_ctx.values()))
            for (a, b), ctx in pair_ctx.items():
                if self.consider(ctx).verdict is Conclusion.PASS:
                    interactions.append(
                        Interaction(
                            InteractionKind.CANCEL,
                            self.canonical([*a, *b]),
                            (contexts[a], contexts[b]),
                            (ctx,),
                            f"{' + '.join(a)} and {' + '.join(b)} each fail without the other and pass together: "
                            "correct only together, not two culprits",
                        )
                    )
                    removed.update((a, b))
        culprits = [m for m in sets if m not in removed]
        result = [CulpritSet(m, self.memo[m].verdict is Conclusion.FAIL, self._note(m)) for m in culprits]
        if culprits:
            fixed = self._without(order, {p for m in culprits for p in m})
            verdict = self.consider(fixed).verdict
            if verdict is not Conclusion.PASS:
                self.notes.append(
                    f"without the culprits the configuration {{{', '.join(fixed)}}} is {verdict.value}, not pass"
                )
        return self._finish(result, interactions)

    def _recheck_flips(self, names: list[str], wanted: Wanted) -> bool:
        """Re-measure a fail that rests on a single trial; True when it no longer fails."""
        config = self.canonical(names)
        judgement = self.memo.get(config)
        if self._recheck is None or judgement is None or len(judgement.trials) != 1:
            return False
        again = self._recheck(config)
        self.memo[config] = again
        self.considered.append(again)
        return not wanted(again)

    def _confirmed(self, m: Config) -> bool:
        return self.consider(m).verdict is Conclusion.FAIL

    def _ensure_one_minimal(self, m: Config) -> Config:
        """Dropping any one patch of a set of two or more must make it pass; test it, refine if not."""
        while len(m) >= 2:
            ordered = sorted(m, key=lambda p: self._pos.get(p, 0))
            # Dropping a patch drops what requires it too (the gate would add it back otherwise).
            subsets = list(dict.fromkeys(self.canonical(self._without(ordered, [y])) for y in ordered))
            judgements = self.consider_many(subsets)
            failing = [s for s, j in zip(subsets, judgements, strict=True) if j.verdict.bad and len(s) < len(m)]
            if not failing:
                return m
            smaller = sorted(failing[0], key=lambda p: self._pos.get(p, 0))
            m = self.canonical(self._minimal([], smaller, _bad, infer=False) or smaller)
        return m

    # ------------------------------------------------------------------------------------------
    # Helpers.

    def _without(self, order: list[str], names: Iterable[str]) -> list[str]:
        gone = set(names) | self.relations.dependents(names, order)
        return [p for p in order if p not in gone]

    def _context(self, order: list[str], sets: list[Config], keep: list[Config]) -> list[str]:
        """Every patch except the members of the other sets: how ``keep`` behaves among the rest."""
        kept = {p for m in keep for p in m}
        return self._without(order, {p for m in sets for p in m} - kept)

    def _known_pass(self, names: Iterable[str]) -> bool:
        """A subset of a passing configuration passes, unless that pass is contradicted by a failing subset."""
        wanted = set(self.canonical(names))
        fails = [set(cfg) for cfg, j in self.memo.items() if j.verdict is Conclusion.FAIL]
        return any(
            j.verdict is Conclusion.PASS and wanted <= set(cfg) and not any(f <= set(cfg) for f in fails)
            for cfg, j in self.memo.items()
        )

    def _known_prefix(self, base: list[str], cands: list[str]) -> int:
        j = 0
        while j < len(cands) and self._known_pass(base + cands[: j + 1]):
            j += 1
        return j

    def _note(self, m: Config) -> str:
        j = self.memo[m]
        needs = [f"{x} requires {', '.join(self.relations.requires[x])}" for x in m if self.relations.requires.get(x)]
        extra = f" ({'; '.join(needs)})" if needs else ""
        if j.verdict is Conclusion.FAIL:
            return ("fails alone; every patch of it is needed" if len(m) > 1 else "fails alone") + extra
        return f"its own verdict is {j.verdict.value}{extra}"

    def _report(self, left: int, phase: str) -> None:
        if self._progress is not None:
            self._progress(SearchProgress(left, len(self.order), self._found, phase))

    def _stop(self, status: Status, message: str) -> IsolateResult:
        return self._finish([], [], status, message)

    def _finish(
        self,
        culprits: list[CulpritSet],
        interactions: list[Interaction],
        status: Status | None = None,
        message: str = "",
    ) -> IsolateResult:
        if status is None:
            confirmed = [c for c in culprits if c.confirmed]
            status = Status.FOUND if confirmed or interactions else Status.INCONCLUSIVE
            if culprits:
                names = "; ".join(" + ".join(c.patches) for c in culprits)
                message = f"culprit set{'s' if len(culprits) > 1 else ''}: {names}"
            elif interactions:
                message = "no single culprit: the failures come from interactions"
            else:
                message = "no culprit set could be confirmed"
        bad = tuple(j.config for j in self.considered if j.verdict in (Conclusion.INCONCLUSIVE, Conclusion.ERROR))
        self._report(0, "done")
        return IsolateResult(
            status=status,
            message=message,
            culprits=tuple(culprits),
            interactions=tuple(interactions),
            inconclusive=bad,
            searched=tuple(self.order),
            not_searched=dict(self.not_searched),
            judgements=tuple(self.considered),
            notes=tuple(self.notes),
        )


class _Evaporated(Exception):
    """A fail the search was following did not hold when measured again."""


class _OverBudget(Exception):
    """Discovery reached its trial limit."""


def _interleave(a: list[list[str]], b: list[list[str]]) -> list[list[str]]:
    out: list[list[str]] = []
    for i in range(max(len(a), len(b))):
        out.extend(x[i] for x in (a, b) if i < len(x))
    return out


def _bad(j: Judgement) -> bool:
    return j.verdict.bad


def _fails(j: Judgement) -> bool:
    return j.verdict is Conclusion.FAIL


def _passes(j: Judgement) -> bool:
    return j.verdict is Conclusion.PASS


def _pick_plan(n: int, capacity: int) -> str:
    """The minimax table when it applies (one trial per round, n within its size), else bisection."""
    return "table" if capacity == 1 and 1 <= n <= MAX_PATCHES else "bisect"


def _status(verdict: Conclusion) -> Status:
    return Status.ERROR if verdict is Conclusion.ERROR else Status.INCONCLUSIVE
