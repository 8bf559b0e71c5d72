"""A scale computed in construction code (``__init__``) is stored in the module it builds and read on every step,
as a buffer allocated, a dtype chosen or a switch forced there already is. The tree is a trimmed copy of the shape of
vLLM 0.33.0's ``bailing_moe.py`` attention (its rotary dimension from ``partial_rotary_factor``, written back into
``rope_parameters`` and read by ``get_rope``), the shape of vllm#43770 reversed.
"""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_edit

from speedtrap.triage import PatchReport

ROPE = """\
def get_rope(head_size, max_position, rope_parameters=None):
    partial_rotary_factor = 1.0
    if rope_parameters is not None:
        partial_rotary_factor = rope_parameters.get("partial_rotary_factor", 1.0)
    rotary_dim = int(head_size * partial_rotary_factor)
    return RotaryEmbedding(head_size, rotary_dim, max_position)


class RotaryEmbedding:
    def __init__(self, head_size, rotary_dim, max_position):
        self.head_size = head_size
        self.rotary_dim = rotary_dim
        self.max_position = max_position

    def forward(self, positions, q, k):
        q_rot, q_pass = q[..., : self.rotary_dim], q[..., self.rotary_dim :]
        k_rot, k_pass = k[..., : self.rotary_dim], k[..., self.rotary_dim :]
        return rotate(positions, q_rot, q_pass), rotate(positions, k_rot, k_pass)


def rotate(positions, x, rest):
    return x * positions + rest
"""

ATTN = """\
from pkg.rotary import get_rope


class BailingAttention:
    def __init__(self, config, layer_idx):
        self.hidden_size = config.hidden_size
        self.total_num_heads = config.num_attention_heads
        self.head_dim = config.head_dim or (self.hidden_size // self.total_num_heads)
        self.scale = self.head_dim**-0.5

        rotary_dim = getattr(config, "rotary_dim", None)
        if rotary_dim is None:
            partial_rotary_factor = getattr(config, "partial_rotary_factor", 1.0)
            rotary_dim = int(self.head_dim * partial_rotary_factor)
        if rotary_dim is None:
            rotary_dim = self.head_dim
        config.rope_parameters["partial_rotary_factor"] = rotary_dim / self.head_dim

        self.rotary_emb = get_rope(
            self.head_dim,
            max_position=config.max_position_embeddings,
            rope_parameters=config.rope_parameters,
        )

    def forward(self, positions, hidden_states):
        q, k, v = self.qkv(hidden_states)
        q, k = self.rotary_emb.forward(positions, q, k)
        return self.attn(q, k, v, self.scale)


class BailingDecoderLayer:
    def __init__(self, config, layer_idx):
        self.attention = BailingAttention(config, layer_idx)

    def forward(self, positions, hidden_states):
        return self.attention.forward(positions, hidden_states)


class BailingModel:
    def __init__(self, config):
        self.layers = [BailingDecoderLayer(config, i) for i in range(config.num_hidden_layers)]

    def forward(self, positions, hidden_states):
        for layer in self.layers:
            hidden_states = layer.forward(positions, hidden_states)
        return hidden_states
"""

PARTIAL = (
    "        if rotary_dim is None:\n"
    '            partial_rotary_factor = getattr(config, "partial_rotary_factor", 1.0)\n'
    "            rotary_dim = int(self.head_dim * partial_rotary_factor)\n"
    "        if rotary_dim is None:\n"
)


def _triage(tmp_path: Path, old: str, new: str) -> PatchReport:
    others = {"pkg/__init__.py": "", "pkg/rotary.py": ROPE}
    return triage_edit(tmp_path, "pkg/bailing.py", ATTN, old, new, others)


def test_a_scale_removed_in_construction_code_is_read_on_every_step(tmp_path: Path) -> None:
    """The multiply by ``partial_rotary_factor`` removed from ``__init__``: the rotary dimension it computed is built
    into every layer's rotary embedding, so the change reaches every step, not only the model's construction."""
    report = _triage(tmp_path, PARTIAL, "        if rotary_dim is None:\n")
    assert any(s.kind == "scale" for s in report.signals.signals), report.ranking.reasons
    assert "partial_rotary_factor" in report.ranking.reasons[0], report.ranking.reasons
    assert report.ranking.points["exposure"] == 1, report.ranking.points
    assert report.tier == 1, report.ranking.reasons


def test_a_setup_change_without_a_risk_stays_below_tier_one(tmp_path: Path) -> None:
    """The lift is for a scale: a construction-time change no signal reads keeps exposure 0."""
    scale = "        self.scale = self.head_dim**-0.5\n"
    report = _triage(tmp_path, scale, scale.replace("\n", "  # a comment\n"))
    assert report.tier == 3, report.ranking.reasons
    report = _triage(
        tmp_path / "b",
        "        self.total_num_heads = config.num_attention_heads\n",
        '        self.total_num_heads = getattr(config, "num_attention_heads")\n',
    )
    assert report.ranking.points.get("exposure", 0) == 0, report.ranking.points
    assert report.tier == 2, report.ranking.reasons
