"""Where patches come from: diff files, a git range, a manifest, or a built-in target."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speedtrap._errors import UsageError
from speedtrap.patching import Gate
from speedtrap.spec import Platform
from speedtrap.triage.source.diff import decode_diff, parse_diff
from speedtrap.triage.source.manifest import manifest_model, manifest_patches

if TYPE_CHECKING:
    from speedtrap.manifest import Manifest

_GIT_TIMEOUT_S = 120
_SUBJECT_RE = re.compile(r"^Subject:\s*(?:\[[^\]]*\]\s*)?(.*)$", re.M)


@dataclass(frozen=True)
class PatchInput:
    """One patch as triage reads it: a diff, and what its author declared about it (if anything)."""

    name: str
    diff: str | None
    origin: str
    summary: str = ""
    gate: Gate | None = None  # declared gate; None when nobody said
    file_hint: str = ""  # the file a single-file diff applies to, when its paths do not say
    declared: dict[str, Any] = field(default_factory=dict, compare=False)  # kind, scope, phases
    commits: tuple[str, ...] = ()  # a manifest's commit patch: switched per trial by a worktree

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "origin": self.origin,
            "summary": self.summary,
            "gate": self.gate.to_json() if self.gate else None,
            "declared": self.declared,
        }


@dataclass
class PatchSet:
    patches: list[PatchInput]
    tree: Path | None
    label: str
    cli_args: list[str] = field(default_factory=list)  # how to name this source again on the command line
    _tmp: tempfile.TemporaryDirectory[str] | None = None
    tree_label: str | None = None  # how to name the tree when it is a temporary export (removed on close)
    model: str | None = None  # the served model the source names (a manifest's [target] model folder)
    platform: Platform | None = None  # the hardware the source names (a manifest's [target] platform)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def from_diff_files(paths: list[Path], tree: Path | None) -> PatchSet:
    patches = []
    for path in paths:
        try:
            data = Path(path).read_bytes()
        except FileNotFoundError:
            raise UsageError(f"patch file {str(path)!r} does not exist", "pass the path of a unified diff") from None
        except IsADirectoryError:
            raise UsageError(
                f"patch file {str(path)!r} is a directory", "pass diff files, or --range for a git repo"
            ) from None
        except OSError as exc:
            raise UsageError(
                f"cannot read patch file {str(path)!r}: {exc.strerror}", "check the path and permissions"
            ) from None
        text = decode_diff(data, f"patch file {str(path)!r}")
        parse_diff(text, f"patch file {str(path)!r}")  # malformed diffs fail here, naming the file
        subject = _SUBJECT_RE.search(text.split("\ndiff --git", 1)[0])
        patches.append(PatchInput(Path(path).stem, text, f"file {path}", subject.group(1).strip() if subject else ""))
    args = [a for p in paths for a in ("--patch", str(p))] + (["--tree", str(tree)] if tree else [])
    return PatchSet(patches, tree, f"{len(patches)} diff file(s)", args)


def run_git(repo: Path, *args: str, binary: bool = False) -> Any:
    git = shutil.which("git")
    if git is None:
        raise UsageError("git is not installed", "install git, or pass the patches as diff files")
    try:
        argv = [git, "-C", str(repo), *args]  # an argument list, no shell; revisions are checked by check_rev
        proc = subprocess.run(argv, capture_output=True, timeout=_GIT_TIMEOUT_S, check=False)  # noqa: S603
    except subprocess.TimeoutExpired:
        raise UsageError(f"git {args[0]} in {repo} took over {_GIT_TIMEOUT_S} s", "try a smaller range") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise UsageError(
            f"git {args[0]} failed in {repo}: {err[-1] if err else 'exit ' + str(proc.returncode)}",
            "check the repository path and the range (e.g. v1.0..HEAD)",
        )
    return proc.stdout if binary else proc.stdout.decode("utf-8", "replace")


def check_rev(rev: str) -> str:
    if not rev or rev.startswith("-") or any(c.isspace() or c in "\x00" for c in rev):
        raise UsageError(f"bad revision {rev!r} in --range", "write it as A..B, e.g. v0.5.0..HEAD")
    return rev


def from_git_range(repo: Path, rng: str, tree: Path | None) -> PatchSet:
    """One patch per commit of ``A..B`` (merges skipped); the tree is A's, unless --tree says."""
    repo = Path(repo)
    if not repo.exists():
        raise UsageError(f"repository {str(repo)!r} does not exist", "pass --repo with the path of a git checkout")
    if "..." in rng or ".." not in rng:
        raise UsageError(f"--range {rng!r} is not of the form A..B", "write e.g. --range v0.5.0..HEAD")
    a, b = (check_rev(x) for x in rng.split("..", 1))
    if not (repo / ".git").exists():
        argv = [shutil.which("git") or "git", "-C", str(repo), "rev-parse", "--git-dir"]
        inside = subprocess.run(argv, capture_output=True, check=False)  # noqa: S603
        if inside.returncode != 0:
            raise UsageError(f"{str(repo)!r} is not a git repository", "pass --repo with the path of a git checkout")
    for rev in (a, b):
        try:
            run_git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
        except UsageError:
            raise UsageError(
                f"revision {rev!r} is not a commit in {repo}", "check the range with `git log A..B`"
            ) from None
    listing = run_git(repo, "log", "--reverse", "--no-merges", "--format=%H%x00%s", f"{a}..{b}", "--")
    commits = [line.split("\x00", 1) for line in listing.splitlines() if "\x00" in line]
    if not commits:
        raise UsageError(
            f"the range {rng} holds no commits (merges are skipped)", "check the range with `git log A..B`"
        )
    patches = []
    for sha, subject in commits:
        diff = run_git(repo, "show", "--no-color", "--no-ext-diff", "--format=", "--patch", sha, "--")
        slug = re.sub(r"[^A-Za-z0-9]+", "_", subject).strip("_").lower()[:40] or "commit"
        patches.append(PatchInput(f"{sha[:8]}_{slug}", diff if diff.strip() else None, f"commit {sha[:12]}", subject))
    tmp = None
    given_tree = tree
    if tree is None:
        tmp = _archive(repo, a)
        tree = Path(tmp.name)
    args = ["--range", rng, "--repo", str(repo)] + (["--tree", str(given_tree)] if given_tree else [])
    label = f"{len(patches)} commit(s) {rng} in {repo}"
    exported = f"{a} of {repo} (a temporary export, removed after the run)" if tmp is not None else None
    return PatchSet(patches, tree, label, args, tmp, exported)


def from_manifest(manifest: Manifest, tree: Path | None) -> PatchSet:
    """The manifest's patches (read once by :func:`speedtrap.manifest.load_manifest`) with their diffs."""
    path = manifest.path
    target = manifest.target_spec
    repo = manifest.repo
    patches = []
    for mp in manifest_patches(manifest):
        diff = None
        if mp.diff_path is not None:
            try:
                data = mp.diff_path.read_bytes()
            except OSError:
                raise UsageError(
                    f"patch {mp.name!r}: diff {str(mp.diff_path)!r} cannot be read",
                    "fix the diff path in the manifest (it is relative to the manifest)",
                ) from None
            diff = decode_diff(data, f"diff of patch {mp.name!r}")
            parse_diff(diff, f"diff of patch {mp.name!r}")
        origin = f"manifest {path}"
        if mp.commits and repo is not None:
            diff = "".join(_commit_diff(repo, sha) for sha in mp.commits) or None
            origin = f"commit {mp.commits[0][:12]}" + (f"..{mp.commits[-1][:12]}" if len(mp.commits) > 1 else "")
        patches.append(PatchInput(mp.name, diff, origin, mp.summary, mp.gate, commits=mp.commits))
    args = ["--manifest", str(path)] + (["--tree", str(tree)] if tree else [])
    tmp = None
    tree = tree or manifest.tree
    if tree is None and repo is not None and manifest.base is not None:
        tmp = _archive(repo, manifest.base)
        tree = Path(tmp.name)
    model = manifest_model(manifest)
    return PatchSet(
        patches,
        tree,
        f"{len(patches)} patch(es) of {path}",
        args,
        tmp,
        model=str(model) if model is not None else None,
        platform=target.platform if target is not None else None,
    )


def _commit_diff(repo: Path, sha: str) -> str:
    text: str = run_git(repo, "show", "--no-color", "--no-ext-diff", "--format=", "--patch", sha, "--")
    return text


def _archive(repo: Path, rev: str) -> tempfile.TemporaryDirectory[str]:
    """The tree of ``rev`` unpacked in a temporary directory (the source the diffs apply to)."""
    tmp = tempfile.TemporaryDirectory(prefix="speedtrap-tree-")
    data = run_git(repo, "archive", "--format=tar", rev, binary=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(tmp.name, filter=_inside_only)
    return tmp


def _inside_only(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """The ``data`` filter, except that a link it refuses (to an absolute path, or out of the tree: a repository
    linking compiled ``.so`` files into a venv) is left out instead of failing the whole export."""
    try:
        return tarfile.data_filter(member, dest)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        return None


def target_patch_inputs(name: str, patches: Sequence[str] = ()) -> tuple[list[PatchInput], Path]:
    """A target's patches (with their declared facts) and its source directory; the user patches
    (``module:function``) among ``patches`` are read beside the catalogue's."""
    import inspect as _inspect

    from speedtrap.targets import resolve_target, user_patches

    target = resolve_target("smol-moe" if name == "smolmoe" else name)
    infos = [*target.patch_infos(), *(p.info for p in user_patches(patches))]  # the user's join the catalogue
    out = []
    for info in infos:
        out.append(
            PatchInput(
                info.name,
                info.diff,
                f"target {target.name}",
                info.summary,
                info.gate,
                info.file,
                {
                    "kind": str(getattr(info.kind, "value", info.kind)),
                    "scope": info.scope,
                    "phases": sorted(str(getattr(p, "value", p)) for p in info.phases),
                },
            )
        )
    source = getattr(target, "source_dir", None) or Path(_inspect.getfile(type(target))).parent
    return out, Path(source)


def from_target(name: str, tree: Path | None, searched: Sequence[str] = ()) -> PatchSet:
    patches, source = target_patch_inputs(name, searched)
    args = ["--target", name] + (["--tree", str(tree)] if tree else [])
    return PatchSet(patches, tree or source, f"target {name} ({len(patches)} patches)", args)
