"""A switch no longer set (C-family): `hparams.rope_finetuned = true;` removed from one architecture's loader
case, while the shared graph builder tests the flag (through a local): those models now take the other path.
Read on tokens; the test that reads the flag is named."""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_edit

from speedtrap.triage import PatchReport

CPP = """\
struct hparams_t { bool rope_finetuned = false; bool use_bias = false; float f_logit_scale = 1.0f; };

void load_hparams(int arch, hparams_t & hparams) {
    switch (arch) {
        case ARCH_MINI:
            {
                hparams.f_logit_scale = 0.5f;
                // this model uses rope by default
                hparams.rope_finetuned = true;
                hparams.use_bias = true;
            } break;
        default: break;
    }
    bool trained = true;
    LOG_INFO("rope_finetuned = %s\\n", hparams.rope_finetuned ? "yes" : "no");
}

void build_graph(const hparams_t & hparams, int n_layer) {
    for (int il = 0; il < n_layer; ++il) {
        const bool use_rope = hparams.rope_finetuned;
        if (use_rope) {
            apply_rope(il);
        }
    }
}
"""

REL = "src/model.cpp"


def _report(tmp_path: Path, old: str, new: str) -> PatchReport:
    return triage_edit(tmp_path, REL, CPP, old, new)


def test_a_switch_no_longer_set_names_the_test_that_reads_it(tmp_path: Path) -> None:
    p = _report(tmp_path, "                hparams.rope_finetuned = true;\n", "")
    first = p.ranking.reasons[0]
    assert first.startswith("no longer sets `hparams.rope_finetuned = true`: the test `if (use_rope) {`")
    assert "no known risky pattern" not in first
    assert p.ranking.points["guard"] == 3


def test_a_switch_flipped_is_the_same_change(tmp_path: Path) -> None:
    p = _report(tmp_path, "hparams.rope_finetuned = true;", "hparams.rope_finetuned = false;")
    assert p.ranking.reasons[0].startswith("sets `hparams.rope_finetuned = false` instead of `true`")


def test_a_local_or_an_untested_field_is_not_a_switch(tmp_path: Path) -> None:
    local = _report(tmp_path / "a", "    bool trained = true;\n", "")
    assert "no known risky pattern matched" in local.ranking.reasons[0]
    untested = _report(tmp_path / "b", "                hparams.use_bias = true;\n", "")
    assert "no known risky pattern matched" in untested.ranking.reasons[0]
