"""User patches for the tests, loaded by file path (``.../user_patches.py:name``) as a user's would be."""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from speedtrap.localize.examples import apply_factor_again, drop_factor
from speedtrap.patching import Undo


def factor_again_layer_1(model: nn.Module) -> Undo:
    """Apply routed_scaling_factor once more on the routed output of layer 1 only."""
    return apply_factor_again(model, layers={1})


def factor_again_layers_1_3(model: nn.Module) -> Undo:
    return apply_factor_again(model, layers={1, 3})


def drop_factor_layer_2(model: nn.Module) -> Undo:
    """Pin routed_scaling_factor to 1.0 in layer 2's router."""
    return drop_factor(model, layers={2})


class _Boom(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        raise RuntimeError("kernel not built for this shape")


def raises_in_forward(model: nn.Module) -> Undo:
    """Swap layer 1's MLP for a module whose forward raises."""
    layer = model.get_submodule("model.layers.1")
    undo = Undo()
    undo.swap(layer, "mlp", _Boom(layer.get_submodule("mlp")))
    return undo


def fails_to_apply(model: nn.Module) -> Undo:
    """Looks for a module the model does not have."""
    model.get_submodule("model.layers.99.mlp")
    return Undo()


def returns_nothing(model: nn.Module) -> None:
    """Forgets to return an undo handle."""


class _Bf16Proj(nn.Module):
    """A Linear computed in bf16 (the precision patch every stack has)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: Tensor) -> Tensor:
        weight = self.inner.weight.bfloat16()
        return nn.functional.linear(x.bfloat16(), weight).to(x.dtype)


def bf16_layer_2_o_proj(model: nn.Module) -> Undo:
    """Compute layer 2's attention output projection as a bf16 GEMM."""
    attn = model.get_submodule("model.layers.2.self_attn")
    undo = Undo()
    undo.swap(attn, "o_proj", _Bf16Proj(attn.get_submodule("o_proj")))
    return undo


class _SameMath(nn.Module):
    """Calls the module it wraps: a kernel swap that computes exactly the same thing."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner(*args, **kwargs)


def same_math_layer_1_mlp(model: nn.Module) -> Undo:
    """Wrap layer 1's MLP in a module that calls it unchanged (harmless by construction)."""
    layer = model.get_submodule("model.layers.1")
    undo = Undo()
    undo.swap(layer, "mlp", _SameMath(layer.get_submodule("mlp")))
    return undo


same_math_layer_1_mlp.speedtrap_kind = "kernel"  # type: ignore[attr-defined]
same_math_layer_1_mlp.speedtrap_layers = (1,)  # type: ignore[attr-defined]
factor_again_layer_1.speedtrap_kind = "scaling"  # type: ignore[attr-defined]
factor_again_layer_1.speedtrap_layers = (1,)  # type: ignore[attr-defined]
drop_factor_layer_2.speedtrap_kind = "scaling"  # type: ignore[attr-defined]
drop_factor_layer_2.speedtrap_layers = (2,)  # type: ignore[attr-defined]


class _Scaled(nn.Module):
    """The wrapped module's output times a constant (a factor applied once more than it should be)."""

    def __init__(self, inner: nn.Module, factor: float) -> None:
        super().__init__()
        self.inner = inner
        self.factor = factor

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        out: Tensor = self.inner(*args, **kwargs)
        return out * self.factor


def mlp_times_2_25_first_3_layers(model: nn.Module) -> Undo:
    """Multiply the MLP output of layers 0-2 by 2.25 (1.5 applied twice): the seed's double application."""
    undo = Undo()
    for i in range(3):
        layer = model.get_submodule(f"model.layers.{i}")
        undo.swap(layer, "mlp", _Scaled(layer.get_submodule("mlp"), 2.25))
    return undo


mlp_times_2_25_first_3_layers.speedtrap_kind = "scaling"  # type: ignore[attr-defined]
mlp_times_2_25_first_3_layers.speedtrap_layers = (0, 1, 2)  # type: ignore[attr-defined]
