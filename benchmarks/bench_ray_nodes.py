"""The vLLM PD example's hunt with its roles on two Ray nodes vs the same hunt on one node, side by side.

    OMP_NUM_THREADS=1 flock /work/heavy.lock .venv/bin/python benchmarks/bench_ray_nodes.py [--order two,one]

One local Ray cluster (tests/vllm/vllm_pd_ray.py: a head of 1 CPU labelled ``speedtrap=head``, two nodes of
2 CPUs labelled ``speedtrap=a`` and ``speedtrap=b``, three raylets on this machine) and two manifests derived
from examples/vllm-pd/speedtrap.toml that differ only in the decode's node label:

- two nodes: prefill on ``speedtrap=a``, decode on ``speedtrap=b``, router on the head;
- one node: prefill and decode both on ``speedtrap=a``, router on the head.

Each hunt runs in a fresh run directory through ``isolate`` with a ``RayExecutor`` (what ``speedtrap bisect
--manifest F --executor ray --address HEAD`` runs); each records its own baseline first (the driver, on this
machine), so both pay the same. Printed: each hunt's culprit, trials, launches and wall time, and the ratio
two nodes / one node (the goal: at most 1.2). Both hunts must name the same culprit.

On one host the "nodes" share the same cores, memory and loopback network: the ratio measures what placing the
roles over two raylets costs speedtrap (placement groups, one actor per role, cross-node addresses), not a real
network's KV transfer.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "vllm"))

from vllm_pd_ray import ONE_NODE, TWO_NODES, local_cluster, placed_manifest  # noqa: E402
from vllm_stack import ensure_stack  # noqa: E402

from speedtrap.isolate import RayExecutor, isolate  # noqa: E402
from speedtrap.manifest import load_manifest  # noqa: E402


def hunt(folder: Path, where: dict[str, str]) -> tuple[list[list[str]], int, int, float]:
    manifest = load_manifest(placed_manifest(folder, where, f"bench-{os.getpid()}"))
    t0 = time.monotonic()
    with RayExecutor() as executor:
        result = isolate(manifest, folder / "run", executor=executor)
    wall = time.monotonic() - t0
    return [sorted(c.patches) for c in result.culprits], len(result.trials), result.launches, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--order", default="two,one", help="which hunt first: two,one or one,two")
    args = parser.parse_args()
    order = [o for o in args.order.split(",") if o]
    if sorted(order) != ["one", "two"]:
        raise SystemExit("--order must name two and one, e.g. --order two,one")
    ensure_stack()
    placements = {"two": TWO_NODES, "one": ONE_NODE}
    rows: dict[str, tuple[list[list[str]], int, int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, local_cluster():
        for name in order:
            rows[name] = hunt(Path(tmp) / name, placements[name])
    print(f"{'placement':<44} {'culprits':<30} {'trials':>6} {'launches':>8} {'wall s':>7}")
    for name in ("two", "one"):
        culprits, trials, launches, wall = rows[name]
        where = ", ".join(f"{r} {label.split('=')[1]}" for r, label in placements[name].items())
        shown = "; ".join("+".join(c) for c in culprits)
        print(f"{name + ' node(s): ' + where:<44} {shown:<30} {trials:>6} {launches:>8} {wall:>7.0f}")
    ratio = rows["two"][3] / rows["one"][3]
    print(f"two nodes / one node: {ratio:.2f}x (goal <= 1.2x); load average now {os.getloadavg()[0]:.1f}")
    if rows["two"][0] != rows["one"][0]:
        raise SystemExit("the two placements name different culprits")


if __name__ == "__main__":
    main()
