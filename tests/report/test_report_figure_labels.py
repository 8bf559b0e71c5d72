"""Patch names on the figures' axes: a user's file entry points (``/a/long/path/patches.py:name``) used to
give labels so long that matplotlib collapsed the trial log's axes to nothing (a warning, and an empty
plot in the report)."""

from __future__ import annotations

import warnings

from hypothesis import given
from hypothesis import strategies as st

from speedtrap.isolate import Outcome, Trial
from speedtrap.report import _figures
from speedtrap.report._stages import IsolationSection

LONG = "/tmp/tmp.xpe7Ihuqhs/x/tests/localize/user_patches.py:"
PATCHES = (LONG + "factor_again_layer_1", LONG + "same_math_layer_1_mlp", LONG + "drop_factor_layer_2")


def _section(configs: list[tuple[str, ...]]) -> IsolationSection:
    trials = tuple(
        Trial(i, config, 0, "ok", Outcome.FAIL if config else Outcome.PASS, {"kl_p99": 0.5 * i})
        for i, config in enumerate(configs)
    )
    return IsolationSection("found", "", PATCHES, "fail when kl_p99 > 0.1", "kl_p99", 0.1, (), (), trials)


def test_a_trial_log_of_long_file_patch_names_keeps_its_axes() -> None:
    section = _section([(), PATCHES, PATCHES[:2], (PATCHES[0], PATCHES[2]), PATCHES[1:]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "constrained_layout not applied because axes sizes collapsed to zero"
        fig = _figures.trial_log(section, 0.1)
        png = _figures.png(fig)
    (ax, *_) = fig.axes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "#3  user_patches.py:factor_again_layer_1 + user_patches.py:drop_factor_layer_2" in labels
    assert ax.get_position().width > 0.3  # the bars keep most of the figure's width
    assert len(png) > 1000


@given(st.text(min_size=1, max_size=300))
def test_a_label_is_never_longer_than_the_limit(name: str) -> None:
    label = _figures.patch_label(name)
    assert len(label) <= _figures.LABEL_CHARS
    assert label == name or label.endswith("…") or ":" in label
