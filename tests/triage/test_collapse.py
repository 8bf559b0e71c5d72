"""A selection collapsed into one arm (``c ? A : B`` -> ``B`` in C-family code, ``A if c else B`` -> ``B`` in Python)
is a selection change naming the condition and both arms. The C++ is a trimmed copy of the KV-cache shift of the
llama.cpp vendored by llama-cpp-python 0.3.16 (``llama_kv_cache_unified::build_rope_shift``, the shape of
llama.cpp#13870); the Python of a backend choice as vLLM writes them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _triage_one import triage_one_report

from speedtrap.triage import PatchReport
from speedtrap.triage.cfamily.selection_collapsed import _conditionals
from speedtrap.triage.cfamily.tokens import tokens_at

SHIFT = """\
ggml_tensor * llama_kv_cache_unified::build_rope_shift(
        ggml_context * ctx, ggml_tensor * cur, ggml_tensor * shift) const {
    const auto & n_rot     = hparams.n_rot;
    const auto & rope_type = hparams.rope_type == LLAMA_ROPE_TYPE_MROPE
                                // for M-RoPE, rotate the whole vector when doing KV shift
                                ? LLAMA_ROPE_TYPE_NEOX
                                : hparams.rope_type;
    const float attn = cparams.use_yarn && freq_scale < 1.0f ? 1.0f / (1.0f + 0.1f * logf(1.0f / freq_scale)) : 1.0f;
    return ggml_rope_ext_inplace(ctx, cur, shift, nullptr, n_rot, rope_type, attn);
}
"""
PY = """\
def select(self, dtype, use_fp8):
    scale = self.k_scale if use_fp8 else 1.0
    backend = "flashinfer" if dtype == "bf16" else "triton"
    return backend, scale
"""


def run(tmp_path: Path, rel: str, text: str, old: str, new: str) -> PatchReport:
    return triage_one_report(tmp_path, rel, text, text.replace(old, new))


def test_a_c_conditional_collapsed_into_its_else_arm(tmp_path: Path) -> None:
    old = (
        "    const auto & rope_type = hparams.rope_type == LLAMA_ROPE_TYPE_MROPE\n"
        "                                // for M-RoPE, rotate the whole vector when doing KV shift\n"
        "                                ? LLAMA_ROPE_TYPE_NEOX\n"
        "                                : hparams.rope_type;\n"
    )
    report = run(tmp_path, "src/kv.cpp", SHIFT, old, "    const auto & rope_type = hparams.rope_type;\n")
    said = "\n".join(report.ranking.in_full)
    assert "collapses the selection on `hparams.rope_type == LLAMA_ROPE_TYPE_MROPE`" in said, said
    assert "got `LLAMA_ROPE_TYPE_NEOX`" in said and "now gets `hparams.rope_type`" in said, said
    assert report.tier <= 2 and "no known risky pattern" not in said


def test_the_condition_of_a_c_conditional_spans_and_and_or() -> None:
    toks = tokens_at("x = a && b ? f(c ? 1 : 2) : 3;")
    assert toks is not None
    found = {(" ".join(t for t, _ in toks[s:q])) for s, q, _c, _e in _conditionals(toks)}
    assert found == {"a && b", "c"}


def test_a_python_conditional_collapsed_into_its_body(tmp_path: Path) -> None:
    report = run(tmp_path, "pkg/m.py", PY, '"flashinfer" if dtype == "bf16" else "triton"', '"flashinfer"')
    said = "\n".join(report.ranking.in_full)
    assert "collapses the selection on `dtype == 'bf16'`" in said and "now gets `'flashinfer'`" in said, said


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"flashinfer" if dtype == "bf16" else "triton"', '"flashinfer" if dtype == "fp16" else "triton"'),
        ('"flashinfer" if dtype == "bf16" else "triton"', '"cutlass"'),
    ],
)
def test_no_collapse_claimed_for_another_change(tmp_path: Path, old: str, new: str) -> None:
    report = run(tmp_path, "pkg/m.py", PY, old, new)
    assert not any("collapses the selection" in r for r in report.ranking.reasons), report.ranking.reasons


LLAMA4 = """\
class Llama4ForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config, prefix=""):
        # update temperature tuning config from generation config
        gen_config = vllm_config.model_config.try_get_generation_config()
        gen_config.update(vllm_config.model_config.override_generation_config)
        # enable temperature tuning by default when max_model_len > 32K
        default_attn_temperature_tuning = vllm_config.model_config.max_model_len > 32768
        vllm_config.model_config.hf_config.attn_temperature_tuning = gen_config.get(
            "attn_temperature_tuning", default_attn_temperature_tuning
        )
        super().__init__(vllm_config=vllm_config, prefix=prefix)
"""
FORCED = (
    "        # enable temperature tuning by default when max_model_len > 32K\n"
    "        default_attn_temperature_tuning = vllm_config.model_config.max_model_len > 32768\n"
    "        vllm_config.model_config.hf_config.attn_temperature_tuning = gen_config.get(\n"
    '            "attn_temperature_tuning", default_attn_temperature_tuning\n'
    "        )\n"
)


def test_a_condition_forced_to_a_constant_at_construction(tmp_path: Path) -> None:
    """The shape of vllm#16439 reversed (vLLM 0.10.1.1's ``Llama4ForCausalLM.__init__``): the default computed
    from ``max_model_len > 32768`` replaced by ``False``; a switch forced at construction is read on every step."""
    new = (
        "        vllm_config.model_config.hf_config.attn_temperature_tuning = gen_config.get(\n"
        '            "attn_temperature_tuning", False\n'
        "        )\n"
    )
    report = run(tmp_path, "pkg/llama4.py", LLAMA4, FORCED, new)
    said = report.ranking.in_full[0]
    assert "forces the condition `vllm_config.model_config.max_model_len > 32768" in said and "to `False`" in said
    assert report.tier == 1, report.ranking.reasons


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("max_model_len > 32768", "max_model_len > 65536"),  # the condition changed, not forced
        ('"attn_temperature_tuning", default_attn_temperature_tuning', '"attn_temperature_tuning", True'),
    ],
)
def test_a_forced_condition_needs_the_condition_gone(tmp_path: Path, old: str, new: str) -> None:
    report = run(tmp_path, "pkg/llama4.py", LLAMA4, old, new)
    assert not any("forces the condition" in r for r in report.ranking.reasons), report.ranking.reasons


ATTEND = """\
class Attention:
    def __init__(self, k_scale):
        self.k_scale = k_scale

    def forward(self, q, use_fp8):
        return self.attend(q, scale=self.k_scale if use_fp8 else 1.0)

    def attend(self, q, scale):
        return q * scale
"""


def test_an_identity_conditional_the_value_flow_reads_is_said_once(tmp_path: Path) -> None:
    """An identity arm (``1.0``) dropped from a call argument is a scale change the value flow reads; the collapse
    is not said a second time in front of it."""
    report = run(tmp_path, "pkg/attn.py", ATTEND, "scale=self.k_scale if use_fp8 else 1.0", "scale=self.k_scale")
    assert any(s.kind == "scale" for s in report.signals.signals), report.ranking.reasons
    assert not any("collapses the selection" in r for r in report.ranking.reasons), report.ranking.reasons
