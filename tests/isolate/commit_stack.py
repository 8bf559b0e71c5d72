"""A small Python "stack" in a temporary git repository, with its speed patches as commits.

The base holds ``stack/model.py`` (a router and a combine that applies ``SCALE`` once) and
``stack/server.py`` (an HTTP server reporting ``metric = |combine(1) - SCALE|``). The commits:

- ``fused_helper``: rewrites ``helper`` (harmless: same value);
- ``route_scale``: the router multiplies by ``SCALE`` too, so the scale is applied twice (the culprit);
- ``tuned_helper``: edits the line ``fused_helper`` wrote (harmless), so it only applies on top of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TINY_PROBE = Path(__file__).parent / "tiny_probe.py"

MODEL = '''"""A toy MoE combine: the routed output is scaled once."""

SCALE = 2.5


def route(x: float) -> float:
    return x


def helper(x: float) -> float:
    return x


def combine(x: float) -> float:
    return helper(route(x)) * SCALE
'''

SERVER = '''"""The stack's server: /health, /pid, /figures -> {"metric": abs(combine(1) - SCALE), ...}."""

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from stack import model

PORT = int(sys.argv[sys.argv.index("--port") + 1])


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/figures"):
            body = {"metric": abs(model.combine(1.0) - model.SCALE), "model_file": model.__file__}
        elif self.path.startswith("/pid"):
            body = {"pid": os.getpid()}
        else:
            body = {"ok": True}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def watch_parent(parent):
    while os.getppid() == parent:
        time.sleep(0.3)
    os._exit(0)


if __name__ == "__main__":
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    print("model file:", model.__file__, "fast:", os.environ.get("STACK_FAST", "0"), flush=True)
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
'''

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_CONFIG_NOSYSTEM": "1",
    "HOME": "/nonexistent",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit_edit(repo: Path, path: str, old: str, new: str, subject: str) -> str:
    file = repo / path
    text = file.read_text()
    assert old in text, (old, path)
    file.write_text(text.replace(old, new, 1))
    git(repo, "commit", "-q", "-am", subject)
    return git(repo, "rev-parse", "HEAD")


@dataclass(frozen=True)
class CommitStack:
    repo: Path
    base: str
    commits: dict[str, str]  # patch name -> sha
    subjects: dict[str, str]


def make_stack(root: Path) -> CommitStack:
    repo = root / "stack-repo"
    (repo / "stack").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "stack" / "__init__.py").write_text("")
    (repo / "stack" / "model.py").write_text(MODEL)
    (repo / "stack" / "server.py").write_text(SERVER)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base: the stack")
    base = git(repo, "rev-parse", "HEAD")
    subjects = {
        "fused_helper": "model: fused helper",
        "route_scale": "router: apply the routed scaling factor in the router",
        "tuned_helper": "model: tune the fused helper",
    }
    commits = {
        "fused_helper": commit_edit(
            repo, "stack/model.py", "def helper(x: float) -> float:\n    return x\n",
            "def helper(x: float) -> float:\n    return x + 0.0  # fused\n", subjects["fused_helper"],
        ),
        "route_scale": commit_edit(
            repo, "stack/model.py", "def route(x: float) -> float:\n    return x\n",
            "def route(x: float) -> float:\n    return x * SCALE\n", subjects["route_scale"],
        ),
        "tuned_helper": commit_edit(
            repo, "stack/model.py", "    return x + 0.0  # fused\n", "    return 0.0 + x  # fused, tuned\n",
            subjects["tuned_helper"],
        ),
    }  # fmt: skip
    return CommitStack(repo, base, commits, subjects)


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def toml_text(tables: dict[str, dict[str, Any]], patches: Sequence[dict[str, Any]]) -> str:
    lines: list[str] = []
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items())
        lines.append("")
    for p in patches:
        lines.append("[[patches]]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in p.items())
        lines.append("")
    return "\n".join(lines)


# -- a release window: N commits, ground truth by construction ---------------------------------

WINDOW_CASES = ("single", "pair", "conflict", "none")

WINDOW_MODEL = '''"""A toy MoE combine: the routed output is scaled once."""

SCALE = 2.5

GATE = 0
ROUTE_SCALED = False

PAIR_A = False

PAIR_B = False


def route(x: float) -> float:
    if ROUTE_SCALED or (PAIR_A and PAIR_B):
        return x * SCALE
    return x


def helper(x: float) -> float:
    return x


def combine(x: float) -> float:
    return helper(route(x)) * SCALE
'''


@dataclass(frozen=True)
class Window:
    """A linear history base..HEAD of ``n`` commits; ``culprits``: the subjects whose commits break it."""

    repo: Path
    base: str
    shas: tuple[str, ...]  # history order
    subjects: tuple[str, ...]
    culprits: tuple[str, ...]  # subjects: one (single, conflict) or the two that fail only together (pair)
    case: str


def _copy_tree(src: Path, dst: Path) -> list[str]:
    """``src``'s Python files copied under ``dst``; their paths relative to the repository, sorted."""
    out = []
    for path in sorted(src.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        out.append(f"{dst.name}/{path.relative_to(src).as_posix()}")
    return out


def window_positions(n: int, case: str) -> dict[str, int]:
    """Where the constructed commits sit in a window of ``n`` (0-based): fixed, so runs compare."""
    if case == "single":
        return {"culprit": (7 * n) // 10}
    if case == "pair":
        return {"pair_a": n // 4, "pair_b": (3 * n) // 4}
    if case == "conflict":  # a gate flipped, the flip reverted, then the culprit on the line next to it
        return {"flip": n // 4, "revert": n // 2, "culprit": (3 * n) // 4}
    if case == "none":  # every commit harmless: HEAD passes
        return {}
    raise ValueError(f"case {case!r}: choose from {WINDOW_CASES}")


def make_window(root: Path, n: int, case: str, tree: Path | None = None) -> Window:
    """A repository whose HEAD fails (but for case "none"): ``n`` commits after the base, harmless ones editing knobs.

    Harmless commits each edit their own line of ``stack/knobs.py`` (lines two apart, so any
    subset cherry-picks cleanly); with ``tree`` (an engine's source, e.g. SGLang's installed package)
    its Python files are in the base too, and harmless commit ``i`` instead appends a comment line to
    the tree's ``i``-th Python file (sorted paths, spread over the tree); the constructed ones edit ``stack/model.py``:
    single: ``ROUTE_SCALED = True`` (the scale applied twice); pair: ``PAIR_A`` and ``PAIR_B``
    (the scale applied twice only when both are on); conflict: ``GATE = 1``, later ``GATE = 0``
    again, later ``ROUTE_SCALED = True`` on the next line (the culprit and the flip do not
    cherry-pick together onto the base; every prefix of the history applies).
    """
    places = window_positions(n, case)
    if len(set(places.values())) != len(places) or max(places.values(), default=0) >= n:
        raise ValueError(f"a {case} window needs more than {n} commits")
    repo = root / f"window-{case}-{n}"
    (repo / "stack").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "stack" / "__init__.py").write_text("")
    (repo / "stack" / "model.py").write_text(WINDOW_MODEL)
    (repo / "stack" / "server.py").write_text(SERVER)
    (repo / "stack" / "knobs.py").write_text("".join(f"KNOB_{i} = 0\n\n" for i in range(n)))
    files = _copy_tree(tree, repo / tree.name) if tree is not None else []
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base: the stack")
    base = git(repo, "rev-parse", "HEAD")
    edits = {
        "culprit": ("ROUTE_SCALED = False\n", "ROUTE_SCALED = True\n", "router: apply the routed scale in the router"),
        "pair_a": ("PAIR_A = False\n", "PAIR_A = True\n", "router: enable fused path A"),
        "pair_b": ("PAIR_B = False\n", "PAIR_B = True\n", "router: enable fused path B"),
        "flip": ("GATE = 0\n", "GATE = 1\n", "model: flip the gate"),
        "revert": ("GATE = 1\n", "GATE = 0\n", 'Revert "model: flip the gate"'),
    }
    at = {i: key for key, i in places.items()}
    shas, subjects = [], []
    for i in range(n):
        if i in at:
            old, new, subject = edits[at[i]]
            path = "stack/model.py"
        elif files:
            path = files[(i * len(files)) // n]
            subject = f"{Path(path).parent.name}: note {i}"
            with (repo / path).open("a") as f:
                f.write(f"# window note {i}\n")
            git(repo, "commit", "-q", "-am", subject)
            shas.append(git(repo, "rev-parse", "HEAD"))
            subjects.append(subject)
            continue
        else:
            old, new, subject = f"KNOB_{i} = 0\n", f"KNOB_{i} = {i + 1}\n", f"knobs: tune knob {i}"
            path = "stack/knobs.py"
        shas.append(commit_edit(repo, path, old, new, subject))
        subjects.append(subject)
    culprits = tuple(edits[k][2] for k in places if k in ("culprit", "pair_a", "pair_b"))
    return Window(repo, base, tuple(shas), tuple(subjects), culprits, case)
