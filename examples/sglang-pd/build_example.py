"""Build the SGLang prefill/decode example: the SGLang example's commits and flags on a three-role stack.

    python examples/sglang-pd/build_example.py [--out DIR]   # default examples/sglang-pd/.built (ignored by git)
    speedtrap run --manifest DIR/speedtrap.toml

It makes, in ``DIR`` (rebuilt by this script):

- the SGLang venv and the two PD packages (``tests/sglang/sglang_pd_stack.py``: built once per machine, outside
  the clone);
- ``DIR/model``: the GLM-4.5 MoE export (``examples/sglang/build_example.py``'s ``export_model``);
- ``DIR/sglang-src``: SGLang's package as a git repository with the SGLang example's commits
  (``build_repo``: the seed's ``glm4_fused_topk_scale`` among them);
- ``DIR/speedtrap.toml``: the PD stack of ``sglang_pd_stack.pd_tables`` (prefill and decode on a core each,
  Mooncake over TCP, the router in PD mode), the commits and SGLang's flags as patches, switched per role:

  - ``glm4_fused_topk_scale`` is **split** (``@prefill``, ``@decode``): the search says which role it breaks;
  - the other commits go to both model roles (``shared_experts_bf16``, the two comments);
  - ``chunked_prefill_64`` on the prefill only, ``radix_cache_off`` on both, ``bf16`` (``--dtype``, a setting
    ``target.agree`` names) on both: switched on one role alone it would be a conflict, not a trial.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sglang"))

import sglang_pd_stack as pd  # noqa: E402  (the PD stack's launch recipe, in one place)


def _single() -> ModuleType:
    """The SGLang example's build script (its commits, flags, repository, export), by path: same file name."""
    spec = importlib.util.spec_from_file_location(
        "sglang_single_example", ROOT / "examples" / "sglang" / "build_example.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


single = _single()

OUT = HERE / ".built"
SPLIT = ("glm4_fused_topk_scale",)  # one switch per model role: the search says which role it breaks
ROLES = {"chunked_prefill_64": ["prefill"]}  # switched on in these roles only
REQUEST_TIMEOUT = 300  # one request through the router (a hang ends the trial after this, naming the role)


def manifest_text(python: Path, site: Path, model: Path, repo: Path, shas: dict[str, str], repeats: int = 0) -> str:
    """The example's manifest: the PD stack, the commits and the flags as per-role patches."""
    tables = pd.pd_tables(python, site)
    target = tables["target"]
    target.update(
        model=str(model),
        served_model=str(model),
        repo=str(repo),
        base=shas["base"],
        pythonpath=["."],  # each role's worktree (its own commits) shadows the venv's sglang
        retries=0,
        request_timeout=REQUEST_TIMEOUT,
    )
    lines = [
        "# speedtrap over SGLang 0.5.23 (CPU) prefill/decode-disaggregated, serving smol-moe's function in GLM-4.5's",
        "# MoE layout. Written by examples/sglang-pd/build_example.py (paths and shas are this machine's).",
        "",
        pd.tables_text(tables),
    ]
    patches: list[tuple[str, dict[str, object]]] = []
    for name, _, _, _, message in single.COMMITS:
        if name in shas:
            patches.append((name, {"commit": shas[name], "summary": message}))
    for name, args, summary in single.FLAGS:
        patches.append((name, {"args": args, "summary": summary}))
    for name, fields in patches:
        lines += ["[[patches]]", f'name = "{name}"']
        lines += [f"{k} = {json.dumps(v)}" for k, v in fields.items()]
        if name in SPLIT:
            lines.append("split = true")
        if name in ROLES:
            lines.append(f"roles = {json.dumps(ROLES[name])}")
        lines.append("")
    lines += [
        "[probe]",
        'kind = "divergence"',
        'preset = "quick"',
        'api = "sglang"                     # /generate with input_ids: input logprobs from the prefill, the rest',
        "                                   # from the decode (the router merges them)",
        "",
        "[verdict]",
        'metric = "worst.kl_p99"',
        "bound = 0.05",
        f"repeats = {repeats}",
        "",
        "[search]",
        "prior = []",
        "",
    ]
    return "\n".join(lines)


def build(out: Path = OUT, repeats: int = 0) -> Path:
    """Everything in ``out``; returns the manifest's path."""
    python = pd.ensure_python()
    site = pd.ensure_packages()
    out.mkdir(parents=True, exist_ok=True)
    model = single.export_model(out / "model")
    repo = out / "sglang-src"
    shas = single.build_repo(python, repo)
    manifest = out / "speedtrap.toml"
    manifest.write_text(manifest_text(python, site, model, repo, shas, repeats))
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the folder to build into (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=0, help="[verdict] repeats (default: %(default)s)")
    args = parser.parse_args()
    manifest = build(args.out.resolve(), args.repeats)
    print(f"wrote {manifest}")


if __name__ == "__main__":
    main()
