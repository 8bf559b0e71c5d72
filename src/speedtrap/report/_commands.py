"""The exact command lines that reproduce each part of a report (shown in "Reproduce" and "Missing")."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from speedtrap.rundir import Source


def _patches(patches: Sequence[str]) -> str:
    return f" --patches {shlex.quote(','.join(patches))}" if patches else ""


def whole_run(source: Source, out_dir: str) -> str:
    out = shlex.quote(out_dir)
    if source.manifest:
        return f"speedtrap run --manifest {shlex.quote(source.manifest)} --out {out}"
    quick = " --quick" if source.quick else ""
    if source.target not in (None, "smol-moe") or source.patches:
        return f"speedtrap run {source.flag}{_patches(source.patches)}{quick} --out {out}"
    return f"speedtrap demo{quick} --out {out}"


def triage(source: Source) -> str:
    symbol = f" --symbol {shlex.quote(source.symbol)}" if source.symbol else ""
    return f"speedtrap triage {source.flag}{symbol} --json"


_FLAGS = {
    "lengths": "--lengths",
    "depths": "--depths",
    "samples": "--samples",
    "max_new_tokens": "--max-new-tokens",
    "seed": "--seed",
    "sequences": "--sequences",
    "decode_tokens": "--decode-tokens",
    "bucket_size": "--bucket-size",
    "top_k": "--top-k",
}


def _settings(settings: Mapping[str, Any] | None) -> str:
    out = []
    for key, value in (settings or {}).items():
        flag = _FLAGS.get(key)
        if flag is None:
            continue
        text = (
            ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
            if isinstance(value, (list, tuple))
            else str(value)
        )
        out.append(f" {flag} {shlex.quote(text)}")
    return "".join(out)


def _probe(kind: str, source: Source, patches: Sequence[str], settings: Mapping[str, Any] | None) -> str:
    if source.manifest:  # a probe of a server needs the server: the pipeline launches it per configuration
        return f"speedtrap run --manifest {shlex.quote(source.manifest)}"
    quick = " --quick" if source.quick else ""
    return f"speedtrap probe {kind} {source.flag}{_patches(patches)}{quick}{_settings(settings)} --json"


def recall(source: Source, patches: Sequence[str], settings: Mapping[str, Any] | None = None) -> str:
    return _probe("recall", source, patches, settings)


def divergence(source: Source, patches: Sequence[str], settings: Mapping[str, Any] | None = None) -> str:
    return _probe("divergence", source, patches, settings)


def bisect(source: Source, run_dir: str) -> str:
    return f"speedtrap bisect {source.flag} --run-dir {shlex.quote(run_dir)} --resume --json"


def layers(source: Source, patches: Sequence[str], tokens: int | None = None) -> str:
    size = f" --tokens {tokens}" if tokens else ""
    return f"speedtrap diff layers {source.flag}{_patches(patches)}{size} --json"


def scale(
    source: Source,
    patches: Sequence[str],
    tokens: int | None = None,
    values: Sequence[float] | None = None,
    param: str | None = None,
) -> str:
    param = shlex.quote(param or source.symbol or "routed_scaling_factor")
    size = f" --tokens {tokens}" if tokens else ""
    chosen = f" --values {','.join(f'{v:g}' for v in values)}" if values else ""
    return f"speedtrap check scale {source.flag} --param {param}{_patches(patches)}{size}{chosen} --json"


def report(out_dir: str) -> str:
    return f"speedtrap report {shlex.quote(out_dir)}"
