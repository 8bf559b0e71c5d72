"""The hardware platform a stack is served on (``--platform``, a manifest's ``[target] platform``).

One definition, parsed once where the user writes it; the error names the key and the choices.
"""

from __future__ import annotations

from enum import StrEnum

from speedtrap._errors import SpeedtrapError, UsageError

_ALIASES = {"hip": "rocm"}


class Platform(StrEnum):
    CUDA = "cuda"  # NVIDIA GPUs
    ROCM = "rocm"  # AMD GPUs (HIP)
    CPU = "cpu"
    XPU = "xpu"  # Intel GPUs
    TPU = "tpu"
    NPU = "npu"  # Ascend

    @classmethod
    def parse(cls, value: object, key: str, error: type[SpeedtrapError] = UsageError) -> Platform:
        """``value`` as written under ``key`` (``--platform``, ``target.platform``): one of the choices
        (any case; ``hip`` is ``rocm``), else ``error`` naming the key and the choices."""
        choices = ", ".join(p.value for p in cls)
        if isinstance(value, str):
            text = value.strip().lower()
            text = _ALIASES.get(text, text)
            for p in cls:
                if p.value == text:
                    return p
        raise error(f"{key} {value!r} is not a platform", f"write one of {choices}")
