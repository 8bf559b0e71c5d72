"""A stack trial's placement on a Ray cluster: one placement group per trial slot, one bundle per role.

A trial of a stack of roles (prefill, decode, router) runs whole on one node: the slot's placement group
holds one bundle per role (the trial's resources shared evenly), packed on one node (``STRICT_PACK``), and
the worker that launches every role of the trial runs in its first bundle. The other bundles stay reserved
for the roles the worker starts as processes of that node. A stack whose roles say where they run (``node``,
``resources``) is placed role by role instead, each on its own node (``_ray_roles``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speedtrap.isolate._ray import TrialResources


def stack_roles(oracle: Any) -> tuple[str, ...]:
    """The roles of the stack a server oracle launches per trial (() for one server or an in-process target)."""
    stack = getattr(getattr(oracle, "target", None), "stack", None)
    return tuple(r.name for r in stack.roles) if stack is not None else ()


def role_bundles(resources: TrialResources, roles: Sequence[str]) -> list[dict[str, float]]:
    """One bundle per role, the trial's resources shared evenly: the whole stack reserved on one node."""
    share = {k: v / len(roles) for k, v in resources.as_dict().items() if v > 0}
    return [dict(share) for _ in roles]


def stack_placement(
    resources: TrialResources, roles: Sequence[str], soft_node: str | None
) -> tuple[Any, dict[str, Any]]:
    """A new placement group for one slot (on ``soft_node`` when it has room) and the worker's actor options."""
    from ray.util import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    bundles = role_bundles(resources, roles)
    group = placement_group(bundles, strategy="STRICT_PACK", _soft_target_node_id=soft_node)
    first = bundles[0]
    options: dict[str, Any] = {
        "num_cpus": first.get("CPU", 0.0),
        "num_gpus": first.get("GPU", 0.0),
        "resources": {k: v for k, v in first.items() if k not in ("CPU", "GPU")},
        "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
    }
    return group, options


def remove_group(group: Any) -> None:
    if group is None:
        return
    from ray.util import remove_placement_group

    with contextlib.suppress(Exception):  # its node may be gone already
        remove_placement_group(group)


def group_table(group: Any) -> dict[str, Any]:
    """A placement group as Ray reports it: its strategy, bundles and the node of each bundle."""
    from ray.util import placement_group_table

    table = placement_group_table(group)
    nodes = [table["bundles_to_node_id"].get(i) for i in range(len(table["bundles"]))]
    return {"strategy": table["strategy"], "bundles": list(table["bundles"].values()), "nodes": nodes}
