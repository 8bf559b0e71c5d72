"""``speedtrap init``: a manifest with one commit patch per commit of a range, ranked by triage.

The launch line is left for the user (the command that starts the stack from ``{worktree}``);
everything else (commits, names from their subjects, triage's tiers and reasons as comments,
tier 1 as the search's prior) is filled in.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speedtrap._errors import UsageError
from speedtrap.triage._run import PatchReport, triage
from speedtrap.triage._sources import _check_rev, _git, from_git_range


@dataclass(frozen=True)
class InitResult:
    """The manifest's text, and per patch: name, commit, subject, tier, reasons."""

    text: str
    patches: tuple[dict[str, Any], ...]
    base: str

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base, "patches": list(self.patches), "manifest": self.text}


def _q(value: str) -> str:
    return json.dumps(value)  # a TOML basic string


def _names(subjects: list[str]) -> list[str]:
    out: list[str] = []
    for subject in subjects:
        slug = re.sub(r"[^A-Za-z0-9]+", "_", subject).strip("_").lower()[:64].rstrip("_") or "commit"
        name, n = slug, 2
        while name in out:
            name, n = f"{slug}_{n}", n + 1
        out.append(name)
    return out


def init_manifest(repo: Path, rng: str) -> InitResult:
    """Read ``BASE..HEAD`` of ``repo`` (checked like a manifest's commit patches) and write the manifest text."""
    from speedtrap.stack import PatchSpec, resolve_commits_in

    if "..." in rng or ".." not in rng:
        raise UsageError(f"--range {rng!r} is not of the form BASE..HEAD", "write e.g. --range v0.5.0..HEAD")
    a, b = (_check_rev(x) for x in rng.split("..", 1))
    if not Path(repo).is_dir():
        raise UsageError(f"repository {str(repo)!r} does not exist", "pass --repo with the path of a git checkout")
    listing = _git(Path(repo), "log", "--reverse", "--no-merges", "--format=%H%x00%s", f"{a}..{b}", "--")
    commits = [line.split("\x00", 1) for line in listing.splitlines() if "\x00" in line]
    names = _names([s for _, s in commits])
    specs = [PatchSpec(n, commit=sha) for n, (sha, _) in zip(names, commits, strict=True)]
    if not commits:
        raise UsageError(f"the range {rng} holds no commits (merges are skipped)", "check it with `git log A..B`")
    note = ""
    head_sha = _git(Path(repo), "rev-parse", "--verify", "--quiet", f"{b}^{{commit}}").strip()
    at = _git(Path(repo), "rev-parse", "HEAD").strip()
    if at != head_sha and _git(Path(repo), "merge-base", at, head_sha).strip() != head_sha:
        # The checkout is behind the range's head (e.g. at BASE): triage reads the range as given, and the
        # manifest says what bisect needs (the commits on the checked-out branch).
        top = Path(_git(Path(repo), "rev-parse", "--show-toplevel").strip())
        base = _git(Path(repo), "rev-parse", f"{a}^{{commit}}").strip()
        resolved: tuple[Any, ...] = tuple(specs)
        note = f"check out {b} (or a branch holding it) before `speedtrap bisect`: the checkout is at {at[:12]}"
    else:
        top, base, resolved = resolve_commits_in(Path(repo), a, specs)
    patch_set = from_git_range(top, rng, None)
    try:
        report = triage(patch_set)
    finally:
        patch_set.close()
    by_origin = {p.patch.origin: p for p in report.patches}
    rows = []
    for spec, (sha, subject) in zip(resolved, commits, strict=True):
        rep = by_origin.get(f"commit {sha[:12]}")
        rows.append(_row(spec.name, sha, subject, rep))
    prior = [r["name"] for r in rows if r["tier"] == 1]
    text = _render(top, base, rng, rows, prior)
    if note:
        text = f"# NOTE: {note}\n{text}"
    return InitResult(text, tuple(rows), base)


def _row(name: str, sha: str, subject: str, rep: PatchReport | None) -> dict[str, Any]:
    if rep is None:
        return {"name": name, "commit": sha, "subject": subject, "tier": None, "reasons": [], "gate": "", "phases": ""}
    return {
        "name": name,
        "commit": sha,
        "subject": subject,
        "tier": rep.tier,
        "reasons": list(rep.ranking.reasons),
        "gate": rep.gate.describe(),
        "phases": rep.signals.phases,
    }


def _render(repo: Path, base: str, rng: str, rows: list[dict[str, Any]], prior: list[str]) -> str:
    lines = [
        f"# Written by `speedtrap init --repo {repo} --range {rng}`: one patch per commit, ranked by triage.",
        "# Fill in [target] launch: the command that starts the stack. Each trial runs it from a git worktree",
        "# of `base` plus the commits it switches on ({worktree}; its folders in `pythonpath` come first on",
        "# PYTHONPATH). Your checkout is only read.",
        "",
        "[target]",
        f"repo = {_q(str(repo))}",
        f"base = {_q(base)}",
        "launch = []  # FILL IN, e.g. " + '["python", "-m", "vllm.entrypoints.openai.api_server", "--port", "{port}"]',
        'health = "http://127.0.0.1:{port}/health"',
        'pythonpath = ["."]',
        "",
    ]
    for r in rows:
        tier = f"tier {r['tier']}" if r["tier"] is not None else "not ranked"
        lines.append(
            f"# triage: {tier}; gate read off the diff: {r['gate'] or 'none'}; phases (a guess): {r['phases']}"
        )
        lines.extend(f"#   - {reason}" for reason in r["reasons"])
        lines += ["[[patches]]", f"name = {_q(r['name'])}", f"commit = {_q(r['commit'])}"]
        lines += [f"summary = {_q(r['subject'])}", ""]
    lines += [
        "[probe]",
        'kind = "divergence"',
        "",
        "[verdict]",
        'metric = "worst.kl_p99"',
        "bound = 0.1",
        "",
        "[search]",
        f"prior = [{', '.join(_q(p) for p in prior)}]  # triage's tier 1",
        "",
    ]
    return "\n".join(lines)
