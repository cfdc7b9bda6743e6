"""Workers, the dock and threads: the `resources`, `dock` and `threads` sections.

These declare what the user asked for; whether a run then uses Ray, and how many threads a
micro-batch gets on this machine, is decided in `entrepot.grpo.run.deployment`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from entrepot.grpo.config.fields import check, check_choice, doc

__all__ = ["DockConfig", "ResourcesConfig", "ThreadsConfig"]


@dataclass(kw_only=True)
class ResourcesConfig:
    """Workers and how they run."""

    use_ray: bool | None = field(
        default=None,
        metadata=doc(
            "Run dock, actor and reward workers as Ray actors. null (auto): Ray only when the run needs "
            "it (several workers in a role, separate or overlapping workers, a cluster address in "
            "resources.ray_address or RAY_ADDRESS), else one process, which starts in seconds; "
            "true / false force it."
        ),
    )
    ray_address: str | None = field(
        default=None, metadata=doc("Ray cluster address; None starts a local Ray.")
    )
    num_actor_workers: int = field(
        default=1,
        metadata=doc(
            "Data-parallel replicas of the co-located actor; the group has this x parallel.train.tensor "
            "x parallel.train.pipeline ranks."
        ),
    )
    num_reward_workers: int = field(default=1, metadata=doc("Rule-reward workers."))
    colocate: bool = field(
        default=True,
        metadata=doc(
            "true: the reference and the reward models time-share the actor ranks' devices (each on the "
            "device only for its stage when offloaded); false: they run on their own Ray workers and "
            "resources, overlapping with the actor where the dock allows (engine.train=torch)."
        ),
    )
    num_reference_workers: int | None = field(
        default=None,
        metadata=doc("resources.colocate=false: reference workers (null = 1); must be null when co-located."),
    )
    num_reward_model_workers: int | None = field(
        default=None,
        metadata=doc(
            "resources.colocate=false: reward-model workers (null = 1); must be null when co-located."
        ),
    )
    blocking: bool = field(
        default=True,
        metadata=doc("Run stages one after another; False lets stages overlap through the dock."),
    )
    num_cpus_per_worker: float = field(
        default=0.01, metadata=doc("Ray CPUs reserved per worker (fractional shares co-locate).")
    )
    custom_resources_per_worker: dict[str, float] = field(
        default_factory=dict,
        metadata=doc(
            "Ray custom resources reserved per device worker (each actor rank, and the separate "
            "reference / reward-model workers), e.g. {NPU: 1} on an Ascend cluster whose nodes were "
            "started with --resources='{\"NPU\": 8}'. Name -> amount: a fraction up to 1 or a whole "
            "number; CPUs and GPUs come from num_cpus_per_worker and engine.device."
        ),
    )
    stage_timeout_s: float = field(
        default=900.0,
        metadata=doc(
            "Longest a stage may wait for its dock rows, and the driver for a stage's result; "
            "past it the step fails naming the stage (no silent hang)."
        ),
    )

    def __post_init__(self) -> None:
        check(self.num_actor_workers >= 1, "resources.num_actor_workers", self.num_actor_workers, ">= 1")
        check(self.num_reward_workers >= 1, "resources.num_reward_workers", self.num_reward_workers, ">= 1")
        check(
            self.num_cpus_per_worker >= 0, "resources.num_cpus_per_worker", self.num_cpus_per_worker, ">= 0"
        )
        check(self.stage_timeout_s > 0, "resources.stage_timeout_s", self.stage_timeout_s, "> 0")
        custom = self.custom_resources_per_worker
        for name, amount in custom.items():
            key = f"resources.custom_resources_per_worker.{name}"
            check(bool(name.strip()), "resources.custom_resources_per_worker", custom,
                   "resource name -> amount, no empty name")  # fmt: skip
            check(name not in ("CPU", "GPU"), key, amount, "left out: CPUs come from "
                   "resources.num_cpus_per_worker, GPUs from engine.device")  # fmt: skip
            check(isinstance(amount, (int, float)) and not isinstance(amount, bool), key, amount, "a number")
            check(amount >= 0 and (amount <= 1 or float(amount).is_integer()), key, amount,
                   ">= 0, and a whole number when above 1 (Ray's rule for resource amounts)")  # fmt: skip
        for name in ("num_reference_workers", "num_reward_model_workers"):
            count = getattr(self, name)
            if count is None:
                continue
            check(count >= 1, f"resources.{name}", count, ">= 1 or null")
            check(not self.colocate, f"resources.{name}", count,
                   "null with resources.colocate=true (the role runs inside the actor ranks)")  # fmt: skip

    @property
    def reference_workers(self) -> int:
        """Workers of the separate reference group (resources.colocate=false)."""
        return self.num_reference_workers or 1

    @property
    def reward_model_workers(self) -> int:
        """Workers of the separate reward-model group (resources.colocate=false)."""
        return self.num_reward_model_workers or 1


@dataclass(kw_only=True)
class DockConfig:
    """Where the experience dock keeps its rows on Ray."""

    shards: int | None = field(
        default=None,
        metadata=doc(
            "Dock shards (entrepot.dock.sharded: one controller, rows spread over shard actors, one per "
            "node in turn); null = one per node of the Ray cluster, so one dock actor on one machine. "
            "Above 1 the run uses Ray."
        ),
    )

    def __post_init__(self) -> None:
        if self.shards is not None:
            check(self.shards >= 1, "dock.shards", self.shards, ">= 1 or null")


@dataclass(kw_only=True)
class ThreadsConfig:
    """Thread counts of every torch process (OpenMP spinning made small jobs 5-10x slower here)."""

    torch_threads: int = field(default=1, metadata=doc("torch.set_num_threads in every process."))
    interop_threads: int = field(
        default=1, metadata=doc("torch.set_num_interop_threads in every worker process.")
    )
    omp_wait_policy: Literal["PASSIVE", "ACTIVE"] = field(
        default="PASSIVE", metadata=doc("OMP_WAIT_POLICY set before torch loads.")
    )
    lanes: int | None = field(
        default=None,
        metadata=doc(
            "Threads that split each log-prob and update micro-batch of the torch engine on CPU, and "
            "the GPT-2 rollout engine's decoding (each runs torch_threads); null = the CPU cores this "
            "process may use, at most 2, in a one-process run, else 1 (Ray workers share the cores)."
        ),
    )

    def __post_init__(self) -> None:
        check(self.torch_threads >= 1, "threads.torch_threads", self.torch_threads, ">= 1")
        if self.lanes is not None:
            check(self.lanes >= 1, "threads.lanes", self.lanes, ">= 1 or null")
        check(self.interop_threads >= 1, "threads.interop_threads", self.interop_threads, ">= 1")
        check_choice("threads.omp_wait_policy", self.omp_wait_policy, ("PASSIVE", "ACTIVE"))
