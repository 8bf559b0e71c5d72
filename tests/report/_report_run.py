"""What the report tests share besides fixtures: the culprit, the run's patches and its settings."""

from __future__ import annotations

CULPRIT = "hash_topk_routed_scaling"
RUN_PATCHES = (CULPRIT, "fused_rmsnorm", "moe_fused_experts")


def small_settings() -> object:
    from speedtrap.pipeline import PipelineSettings

    return PipelineSettings(
        quick=True,
        recall={"lengths": (160,), "depths": (0.5,), "samples": 2},
        divergence={"lengths": (96,), "sequences": 1, "decode_tokens": 8, "bucket_size": 32},
        patches=RUN_PATCHES,
        localize_tokens=24,
        scale_values=(1.25, 2.5, 5.0),
    )
