"""Where a Ray worker group runs: resources reserved before any worker starts, and each rank's node.

Actor ranks (`Placement(..., replicas=True)`): one placement group with one bundle per DP replica,
strategy ``SPREAD``; bundle i holds the resources of replica i's TP x PP ranks, and each of those
ranks is scheduled into it, taking its share (its CPUs, one GPU, its custom resources).

Why this shape. A replica's ranks talk all the time (TP all-reduces every layer): they belong on
one node. Replicas talk once per step (the DP gradient all-reduce): they may sit on different
nodes, and on a cluster they should, each with a node's devices. Ray spreads the bundles of one
placement group, never several placement groups, so "one STRICT_PACK group per replica, replicas
spread" cannot be said directly. A bundle, though, always lies on a single node: a replica-sized
bundle is a STRICT_PACK group of that replica's ranks, and ``SPREAD`` over those bundles puts
replica i on a node of its own whenever the cluster has one free for it, and packs replicas onto
fewer nodes when it does not (one machine: every replica there). ``STRICT_SPREAD`` would refuse to
start on one machine.

Other groups (rule-reward, separate reference / reward-model workers): one bundle per rank, ``PACK``.

`rendezvous` gives torch.distributed's ``tcp://host:port`` on rank 0's node: 127.0.0.1 when every
rank shares one node (a local run listens on loopback only), else that node's cluster address.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from entrepot.grpo.engines.rendezvous import free_local_port
from entrepot.grpo.errors import GRPOError
from entrepot.grpo.workers.ranks import RankInfo

__all__ = ["Node", "Placement"]

_PLACEMENT_TIMEOUT_S = 120.0
_PORT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Node:
    """A Ray node: its id and its address in the cluster (what an error about a lost worker names)."""

    node_id: str
    ip: str

    def __str__(self) -> str:
        return f"node {self.ip} (node id {self.node_id[:12]}...)"


class Placement:
    """The placement group of one worker group, ready, and the node of every rank.

    Args:
        name: the role (``actor``, ``reward``), used in errors and in `describe`.
        ranks: the group's ranks.
        num_cpus: Ray CPUs per rank.
        num_gpus: Ray GPUs per rank.
        resources: Ray custom resources per rank (``{"NPU": 1}``); zero amounts are left out.
        replicas: one ``SPREAD`` bundle per DP replica (actor ranks) rather than one ``PACK`` bundle per rank.
    """

    def __init__(
        self,
        name: str,
        ranks: Sequence[RankInfo],
        *,
        num_cpus: float,
        num_gpus: float = 0,
        resources: dict[str, float] | None = None,
        replicas: bool = False,
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group, placement_group_table

        self.name, self.ranks, self.replicas = name, list(ranks), replicas
        custom = {key: amount for key, amount in (resources or {}).items() if amount > 0}
        self.options: dict[str, Any] = {"num_cpus": num_cpus, "num_gpus": num_gpus, "resources": custom}
        per_rank = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {}), **custom}
        share = self.ranks[0].model_parallel_size if replicas else 1
        num_bundles = self.ranks[0].dp_size if replicas else len(self.ranks)
        bundle = {key: amount * share for key, amount in per_rank.items()}
        self.group = placement_group([bundle] * num_bundles, strategy="SPREAD" if replicas else "PACK")
        try:
            ray.get(self.group.ready(), timeout=_PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            self.remove()  # no half-placed group left holding resources
            what = f"{num_bundles} replicas" if replicas else f"{num_bundles} {name} workers"
            raise GRPOError(
                f"Ray could not place {what} of {bundle} each within {_PLACEMENT_TIMEOUT_S:.0f} s; the "
                f"cluster has {ray.available_resources()} free (lower resources.num_cpus_per_worker, "
                "resources.custom_resources_per_worker or the worker count, or add nodes)"
            ) from None
        bundle_nodes = placement_group_table(self.group)["bundles_to_node_id"]
        ips = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
        node_ids = [bundle_nodes[self.bundle(rank)] for rank in self.ranks]
        self.nodes = [Node(node_id, ips[node_id]) for node_id in node_ids]

    def bundle(self, rank: RankInfo) -> int:
        """The bundle `rank` is scheduled into: its replica's, or its own."""
        return rank.dp_rank if self.replicas else rank.rank

    def actor_options(self, rank: RankInfo) -> dict[str, Any]:
        """``ray.remote(...).options`` of `rank`'s worker: its resources, inside its bundle."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=self.bundle(rank)
        )
        return {**self.options, "scheduling_strategy": strategy}

    def rendezvous(self) -> str:
        """torch.distributed's ``tcp://host:port``, a free port on rank 0's node.

        127.0.0.1 when every rank is on one node, else rank 0's node address; a node other than
        the driver's picks the port itself (a zero-CPU task pinned there).
        """
        first = self.nodes[0]
        host = "127.0.0.1" if all(node == first for node in self.nodes) else first.ip
        return f"tcp://{host}:{self.free_port(host)}"

    def free_port(self, host: str) -> int:
        """A free port on rank 0's node, listening address `host` (picked there by a zero-CPU task
        when that node is not the driver's)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        first = self.nodes[0]
        if first.node_id == ray.get_runtime_context().get_node_id():
            return free_local_port(host=host)
        pick = ray.remote(free_local_port).options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(first.node_id, soft=False)
        )
        return int(ray.get(pick.remote(host=host), timeout=_PORT_TIMEOUT_S))

    def describe(self) -> str:
        """Where the group runs, one entry per replica (actor) or rank: ``actor dp 0 on node ...``."""
        if self.replicas:
            firsts = {r.dp_rank: i for i, r in reversed(list(enumerate(self.ranks)))}
            where = [f"dp {dp} on {self.nodes[i]}" for dp, i in sorted(firsts.items())]
        else:
            where = [f"{rank.name} on {node}" for rank, node in zip(self.ranks, self.nodes, strict=True)]
        return f"{self.name} " + ", ".join(where)

    def remove(self) -> None:
        """Give the reserved resources back."""
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.group)
