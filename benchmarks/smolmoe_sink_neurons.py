"""Which MLP neurons of smol-moe's hash-routed layers build the first token's huge activation, and
whether a config puts them in the routed slice (doubled by ``hash_topk_routed_scaling``) or the shared one.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/smolmoe_sink_neurons.py --fraction 0.07 --hash-layers 3

The activations come from the dense reference (transformers' Llama with the dense weights) on a short
chat; a neuron's contribution at a position is ``|activation| * |down_proj column|``. Which neurons are
routed is read from the built smol-moe's weights (its routed experts' gate rows matched to the dense
rows), not recomputed from the conversion's seed.
"""

from __future__ import annotations

import argparse

import torch
from torch import Tensor

from speedtrap.targets.smolmoe import SmolMoETarget, dense_weights
from speedtrap.targets.smolmoe.equivalence import dense_reference

CHAT = [
    {"role": "system", "content": "You are a helpful assistant. Remember the facts the user tells you."},
    {"role": "user", "content": "The access code for the north gate is 972407. Please remember it."},
    {"role": "user", "content": "What is the access code for the north gate?"},
]


def row_keys(weight: Tensor, probe: Tensor) -> Tensor:
    return (weight.double() * probe).sum(-1)


def routed_neurons(dense_gate: Tensor, routed_gate: Tensor) -> set[int]:
    probe = torch.randn(dense_gate.shape[1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    keys = row_keys(routed_gate, probe)
    return {int(j) for j in torch.nonzero(torch.isin(row_keys(dense_gate, probe), keys)).flatten()}


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", default="0.75", help="routed_fraction")
    parser.add_argument("--hash-layers", type=int, default=3)
    parser.add_argument("--seed", default="0", help="the conversion's seed (neuron split)")
    parser.add_argument("--top", type=int, default=4)
    args = parser.parse_args()
    overrides = {"routed_fraction": args.fraction, "num_hash_layers": str(args.hash_layers), "seed": args.seed}
    smol = SmolMoETarget().load(overrides=overrides)
    ref = dense_reference(dense_weights())
    layers = ref.model.layers[: args.hash_layers]
    acts: dict[int, Tensor] = {}
    for i, layer in enumerate(layers):
        layer.mlp.down_proj.register_forward_hook(lambda _m, inp, _o, i=i: acts.__setitem__(i, inp[0][0].float()))
    ids = smol.chat_ids(CHAT)
    ref(input_ids=torch.tensor([ids]))
    print(f"{len(ids)} tokens; per layer: |MLP out| at token 0 vs median elsewhere, then the top neurons at token 0")
    for i, layer in enumerate(layers):
        down = layer.mlp.down_proj.weight.float()
        contrib = acts[i].abs() * down.norm(dim=0)
        out = (acts[i] @ down.T).norm(dim=-1)
        routed_gate = smol.model.blocks()[i].mlp.experts.mlp.gate_proj.weight
        routed = routed_neurons(layer.mlp.gate_proj.weight, routed_gate)
        top = contrib[0].topk(args.top)
        cells = ", ".join(
            f"n{int(j)} {float(v):.0f} ({'routed' if int(j) in routed else 'shared'})"
            for v, j in zip(top.values, top.indices, strict=True)
        )
        print(f"layer {i}: {out[0]:.0f} vs {out[1:].median():.0f}; {cells}")


if __name__ == "__main__":
    main()
