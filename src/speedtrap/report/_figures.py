"""The report's figures, drawn with matplotlib (Agg, no pyplot state): each titled, axes labelled with units.

Every function takes the report's own data (never a stage's live objects) and returns a
:class:`matplotlib.figure.Figure`; :func:`png` turns one into PNG bytes.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from speedtrap.report._bylength import by_length
from speedtrap.report._model import DivergenceRun, RecallRun
from speedtrap.report._stages import IsolationSection, LayerSection, ScaleSection

if TYPE_CHECKING:
    from matplotlib.figure import Figure

KL_FLOOR = 1e-8  # KL values below this (exact zeros included) are drawn on the floor of the log axis
REL_FLOOR = 1e-16
PHASE_COLORS = {"prefill": "#1f77b4", "decode": "#d62728"}
OUTCOME_COLORS = {"pass": "#2ca02c", "fail": "#d62728", "near": "#ff7f0e", None: "#7f7f7f"}
DPI = 110


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    return fig


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (metadata stripped, so equal figures give equal bytes)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


LABEL_CHARS = 44  # a patch's name on an axis: longer ones are cut (a long label collapses the axes to nothing)


def patch_label(name: str) -> str:
    """A patch's name as a figure shows it: a file entry point (``/long/path/user_patches.py:name``) by its
    file's name and its own, anything still longer than :data:`LABEL_CHARS` cut with an ellipsis."""
    head, sep, tail = name.rpartition(":")
    if sep and ("/" in head or head.endswith(".py")):
        name = f"{Path(head).name}:{tail}"
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"


def _patches_label(patches: Sequence[str]) -> str:
    return " + ".join(map(patch_label, patches)) if patches else "no patch"


# -- probes -------------------------------------------------------------------------------------


def recall_heatmap(run: RecallRun) -> Figure:
    """Accuracy per (context length, depth) cell, with correct/n written in each cell."""
    lengths = sorted({c.length for c in run.cells})
    depths = sorted({c.depth for c in run.cells})
    grid = [[math.nan] * len(lengths) for _ in depths]
    labels = [[""] * len(lengths) for _ in depths]
    for c in run.cells:
        i, j = depths.index(c.depth), lengths.index(c.length)
        grid[i][j] = c.accuracy
        labels[i][j] = f"{c.correct}/{c.n}"
    fig = _figure(1.6 + 1.15 * max(len(lengths), 2), 1.7 + 0.55 * max(len(depths), 2))
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto", origin="upper")
    for i in range(len(depths)):
        for j in range(len(lengths)):
            text = labels[i][j] or "no data"
            strong = not math.isnan(grid[i][j]) and not 0.2 < grid[i][j] < 0.8  # dark red or dark green
            ax.text(j, i, text, ha="center", va="center", fontsize=10, color="white" if strong else "black")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("fact depth (0 = start, 1 = end)")
    o = run.overall
    ax.set_title(
        f"Recall: {run.label}\n{o.correct}/{o.n} correct ({o.accuracy:.0%}, 95% CI {o.low:.0%}-{o.high:.0%})",
        fontsize=10,
    )
    bar = fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
    bar.set_label("accuracy (fraction correct)")
    return fig


RUN_COLORS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2")


def recall_by_length(runs: Sequence[RecallRun]) -> Figure:
    """Accuracy by prompt length (depths pooled), one line per run with Wilson 95% bars; the baseline in green."""
    fig = _figure(5.8, 3.4)
    ax = fig.add_subplot()
    lengths: set[int] = set()
    others = iter(RUN_COLORS * 4)
    placed: dict[tuple[int, float], int] = {}  # labels already at a point: equal cells stack downwards
    for k, run in enumerate(sorted(runs, key=lambda r: bool(r.patches))):
        rows = by_length(run)
        lengths |= {r.length for r in rows}
        xs = [r.length * (1 + 0.012 * (k - 1)) for r in rows]  # a small offset keeps the bars apart
        ys = [r.accuracy for r in rows]
        err = [[y - r.low for y, r in zip(ys, rows, strict=True)], [r.high - y for y, r in zip(ys, rows, strict=True)]]
        color = "#2ca02c" if not run.patches else next(others)
        ax.errorbar(xs, ys, yerr=err, fmt="-o", ms=4, capsize=3, color=color, label=run.label)
        for x, y, r in zip(xs, ys, rows, strict=True):
            spot = (r.length, round(y, 3))
            below = placed[spot] = placed.get(spot, -1) + 1
            offset = (4, 4 - 9 * below)
            ax.annotate(r.text(), (x, y), xytext=offset, textcoords="offset points", fontsize=7, color=color)
    ax.set_xscale("log")
    ticks = sorted(lengths)
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(ticks, [f"{n:,}" for n in ticks])
    ax.set_ylim(-0.03, 1.1)
    ax.set_xlabel("prompt length (tokens, log scale)")
    ax.set_ylabel("recall (fraction correct)")
    ax.set_title("Recall by prompt length (depths pooled, Wilson 95% intervals)", fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower left")
    return fig


def _mid(start: int, end: int) -> float:
    return (start + end - 1) / 2


def _floor(value: float | None, floor: float) -> float:
    return math.nan if value is None or math.isnan(value) else max(value, floor)


def kl_by_position(run: DivergenceRun) -> Figure:
    """p99 (solid) and mean (dashed) KL per position bucket, prefill and decode, log scale."""
    fig = _figure(5.8, 3.4)
    ax = fig.add_subplot()
    lowest = math.inf
    for name, phase in run.phases.items():
        color = PHASE_COLORS.get(name, "#555555")
        xs = [_mid(b.start, b.end) for b in phase.by_bucket]
        for key, style in (("kl_p99", "-"), ("kl_mean", "--")):
            values = [getattr(b.stats, key) for b in phase.by_bucket]
            lowest = min([lowest, *(v for v in values if v > 0)])
            ys = [_floor(v, KL_FLOOR) for v in values]
            ax.plot(xs, ys, style, marker="o", ms=3.5, color=color, label=f"{name} {key[3:]}")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter

    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(bottom=KL_FLOOR / 2 if lowest == math.inf else max(KL_FLOOR / 2, lowest / 5))
    ax.set_xlabel("token position (bucket centre)")
    ax.set_ylabel("KL(baseline ‖ patched) (nats)")
    ax.set_title(f"Divergence by position: {run.label}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, ncols=2, loc="best")
    if lowest == math.inf or lowest < KL_FLOOR:
        ax.text(
            0.01,
            0.02,
            f"values below {KL_FLOOR:g} drawn at {KL_FLOOR:g}",
            transform=ax.transAxes,
            fontsize=7,
            color="#555555",
        )
    return fig


def same_top1_by_position(run: DivergenceRun) -> Figure:
    """The rate at which baseline and patched agree on the most likely next token, per position bucket."""
    fig = _figure(5.8, 3.4)
    ax = fig.add_subplot()
    for name, phase in run.phases.items():
        xs = [_mid(b.start, b.end) for b in phase.by_bucket]
        ys = [b.stats.same_top1 for b in phase.by_bucket]  # NaN where not known: a gap
        ax.plot(xs, ys, "-", marker="o", ms=3.5, color=PHASE_COLORS.get(name, "#555555"), label=name)
    ax.set_ylim(-0.02, 1.02)
    ax.axhline(1.0, color="#999999", lw=0.8, ls=":")
    ax.set_xlabel("token position (bucket centre)")
    ax.set_ylabel("same top-1 (fraction of tokens)")
    ax.set_title(f"Same top-1 token by position: {run.label}", fontsize=10)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="lower left")
    return fig


# -- isolation ----------------------------------------------------------------------------------


def _config_label(config: Sequence[str], searched: Sequence[str]) -> str:
    if not config:
        return "no patch (baseline)"
    left_out = [p for p in searched if p not in config]
    if len(searched) > 2 and set(config) <= set(searched):
        if not left_out:
            return f"all {len(searched)} patches"
        if len(left_out) <= 2 and len(config) > 2:
            return "all but " + _patches_label(left_out)
    if len(config) <= 2:
        return _patches_label(config)
    return f"{patch_label(config[0])} + {len(config) - 1} more"


def trial_log(section: IsolationSection, bound: float | None = None) -> Figure:
    """One bar per trial in search order: its verdict figure, coloured by its outcome, against the bound."""
    trials = list(section.trials)
    fig = _figure(7.6, 1.3 + 0.32 * max(len(trials), 2))
    ax = fig.add_subplot()
    metric = section.metric
    values = [t.figures.get(metric) for t in trials]
    positive = [v for v in values if v is not None and v > 0] + ([bound] if bound else [])
    log = bool(positive) and max(positive) / max(min(positive), 1e-30) > 100
    floor = min(positive) / 10 if positive and log else 0.0
    ys = list(range(len(trials)))
    widths = [max(v, floor) if v is not None else floor for v in values]
    colors = [OUTCOME_COLORS.get(t.outcome, OUTCOME_COLORS[None]) for t in trials]
    ax.barh(ys, widths, color=colors, height=0.65, left=floor if log else 0.0)
    for y, t, v in zip(ys, trials, values, strict=True):
        shown = "no figure" if v is None else f"{v:.3g}" + (" (reused)" if t.reused else "")
        ax.annotate(shown, (max(v or 0.0, floor), y), xytext=(3, 0), textcoords="offset points", va="center",
                    fontsize=7, color="#333333")  # fmt: skip
    ax.set_yticks(ys, [f"#{t.index}  {_config_label(t.config, section.searched)}" for t in trials], fontsize=7.5)
    ax.invert_yaxis()
    if bound is not None:
        ax.axvline(bound, color="#555555", ls="--", lw=1)
        ax.annotate(f"bound {bound:g}", (bound, 1.0), xycoords=("data", "axes fraction"), xytext=(3, -10),
                    textcoords="offset points", fontsize=7.5, color="#555555")  # fmt: skip
    if log:
        ax.set_xscale("log")
        ax.set_xlim(left=floor)
    from matplotlib.patches import Patch

    handles = [
        Patch(color=OUTCOME_COLORS[o], label=o) for o in ("pass", "fail", "near") if any(t.outcome == o for t in trials)
    ]
    if handles:
        ax.legend(handles=handles, fontsize=7.5, loc="lower right")
    ax.set_xlabel(f"{metric or 'verdict figure'}" + (" (log scale; 0 drawn at the axis)" if log else ""))
    ax.set_title(f"Isolation: {len(trials)} trials in search order", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    return fig


# -- localization -------------------------------------------------------------------------------


def layer_growth(layers: LayerSection, patches: Sequence[str]) -> Figure:
    """rel_diff of each layer's output (log scale), the first divergent module marked."""
    fig = _figure(7.2, 3.6)
    ax = fig.add_subplot()
    xs = [g.layer for g in layers.growth]
    ax.plot(
        xs,
        [_floor(g.rel_diff, REL_FLOOR) for g in layers.growth],
        "-o",
        ms=3.5,
        color="#1f77b4",
        label="block output rel_diff",
    )
    if any(g.max_rel_diff is not None for g in layers.growth):
        ax.plot(
            xs,
            [_floor(g.max_rel_diff, REL_FLOOR) for g in layers.growth],
            ":",
            marker=".",
            color="#9467bd",
            label="largest inside the block",
        )
    ax.axhline(layers.threshold, color="#555555", ls="--", lw=1, label=f"threshold {layers.threshold:g}")
    if layers.first_divergent_layer is not None:
        ax.axvline(layers.first_divergent_layer, color="#d62728", lw=1.2)
        ax.annotate(
            f"first divergent: {layers.first_divergent}",
            (layers.first_divergent_layer, 0.06),
            xycoords=("data", "axes fraction"),
            xytext=(6, 0),
            textcoords="offset points",
            fontsize=8,
            color="#d62728",
            va="bottom",
            bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "#d62728", "lw": 0.6, "alpha": 0.9},
        )
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("rel_diff vs baseline (unitless)")
    ax.set_title(f"Layer error growth: {_patches_label(patches)}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="center right")
    return fig


def scale_exponents(scale: ScaleSection, patches: Sequence[str]) -> Figure:
    """The fitted exponent of each module's output in the scalar, with reference lines at 0, 1 and 2."""
    rows = sorted(scale.rows, key=lambda r: (r.layer is None, r.layer or 0, r.module))
    fig = _figure(max(6.0, 1.5 + 0.24 * len(rows)), 3.6)
    ax = fig.add_subplot()
    xs = list(range(len(rows)))
    heights = [r.exponent if r.exponent is not None else 0.0 for r in rows]
    colors = ["#2ca02c" if r.times == 1 else "#7f7f7f" if r.times is None else "#d62728" for r in rows]
    ax.bar(xs, heights, color=colors, width=0.75)
    for y, words in ((0, "0: never applied"), (1, "1: applied once"), (2, "2: applied twice")):
        ax.axhline(y, color="#555555", lw=0.8, ls="--")
        ax.text(1.005, y, words, transform=ax.get_yaxis_transform(), fontsize=7.5, va="center", color="#333333")
    ticks = [str(r.layer) if r.layer is not None else r.module.rsplit(".", 1)[-1] for r in rows]
    step = max(1, len(rows) // 30)
    ax.set_xticks(xs[::step], ticks[::step], fontsize=7.5)
    ax.set_ylim(min(-0.2, *[h - 0.2 for h in heights]), max(2.4, *[h + 0.2 for h in heights]))
    ax.set_xlabel("layer (module whose output depends on the scalar)")
    ax.set_ylabel(f"exponent of {scale.param}")
    ax.set_title(f"Times {scale.param} is applied, per layer: {_patches_label(patches)}", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    return fig
