"""A constant that a CUDA-graph hook returns (the pad value for replayed graphs, the shape of an attention
backend's ``get_cuda_graph_seq_len_fill_value``) changed: a CUDA-graph signal, named with both values."""

from __future__ import annotations

from pathlib import Path

from _triage_one import triage_one_file

from speedtrap.triage.ranking.rank import FORWARD

BACKEND = """\
class AttnBackend:
    def init_forward_metadata(self, batch):
        self.seq_lens = batch.seq_lens

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def get_block_size(self):
        return 1


class CudaGraphRunner:
    def __init__(self, backend, bs):
        self.seq_len_fill_value = backend.get_cuda_graph_seq_len_fill_value()
        self.seq_lens = [self.seq_len_fill_value] * bs
"""


def test_a_graph_hook_returns_another_constant(tmp_path: Path) -> None:
    after = BACKEND.replace(
        "    def get_cuda_graph_seq_len_fill_value(self):\n        return 1\n",
        "    def get_cuda_graph_seq_len_fill_value(self):\n        return 0\n",
    )
    tier, reasons = triage_one_file(tmp_path, "pkg/attn.py", BACKEND, after)
    assert tier == 1
    assert "changes the constant AttnBackend.get_cuda_graph_seq_len_fill_value hands to CUDA-graph" in reasons[0]
    assert "`return 1` -> `return 0`" in reasons[0]


def test_another_function_returning_another_constant_is_not_a_graph_signal(tmp_path: Path) -> None:
    after = BACKEND.replace(
        "    def get_block_size(self):\n        return 1\n", "    def get_block_size(self):\n        return 0\n"
    )
    tier, reasons = triage_one_file(tmp_path, "pkg/attn.py", BACKEND, after)
    assert tier == 2
    assert reasons[0].startswith(FORWARD)


def test_the_same_value_written_as_a_float_is_no_graph_signal(tmp_path: Path) -> None:
    after = BACKEND.replace(
        "    def get_cuda_graph_seq_len_fill_value(self):\n        return 1\n",
        "    def get_cuda_graph_seq_len_fill_value(self):\n        return 1.0\n",
    )
    _, reasons = triage_one_file(tmp_path, "pkg/attn.py", BACKEND, after)
    assert not any("CUDA-graph" in r for r in reasons)
