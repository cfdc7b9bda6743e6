"""The workload of `rl dock bench`: GRPO iterations of puts and gets through a GRPODock.

Only dock calls, in the order the trainer makes them: put_prompts -> rollout -> reference ->
reward -> advantages -> actor update -> clear. The "compute" of each stage is random data of
the right shape, so the timings are the dock's own cost (storing, gathering, padding, and for
the Ray backend the transfer).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from entrepot.cli._lengths import Distribution, generate_lengths


@dataclass(frozen=True, kw_only=True)
class DockWorkload:
    """Size of one benchmark run."""

    prompts: int = 64
    n_samples: int = 8
    prompt_length: int = 128
    response_length: int = 512
    dispatch_size: int = 64
    iterations: int = 5
    layout: str = "padded"
    seed: int = 0

    @property
    def rows(self) -> int:
        """Responses per iteration."""
        return self.prompts * self.n_samples


@dataclass
class StageStats:
    """Accumulated cost of one stage over all iterations."""

    calls: int = 0
    rows: int = 0
    seconds: float = 0.0


@dataclass
class DockBenchResult:
    """Per-stage totals plus the wall time of every iteration."""

    stages: dict[str, StageStats] = field(default_factory=lambda: defaultdict(StageStats))
    iteration_seconds: list[float] = field(default_factory=list)  # wall, data generation included
    bytes_stored: float = 0.0


# (consumer, columns it reads, column it writes or None, kind of the written column)
STAGES: tuple[tuple[str, tuple[str, ...], str | None, str], ...] = (
    ("actor_rollout", ("prompts",), "responses", "tokens"),
    ("ref_log_prob", ("prompts", "responses"), "ref_log_prob", "per_token"),
    ("rule_reward", ("responses",), "rm_scores", "scalar"),
    ("compute_advantage", ("rm_scores", "responses"), "advantages", "scalar"),
    ("actor_train", ("prompts", "responses", "advantages", "ref_log_prob"), None, ""),
)


def _outputs(
    kind: str, column: str, batch: Any, response_lengths: list[int], generator: Any
) -> dict[str, Any]:
    import torch

    rows = len(batch)
    if kind == "tokens":
        lengths = [response_lengths[int(i)] for i in batch.indexes]
        return {column: [torch.randint(0, 32_000, (n,), generator=generator) for n in lengths]}
    if kind == "scalar":
        return {column: torch.rand(rows, generator=generator)}
    lengths = batch.lengths["responses"].tolist()
    return {column: [torch.randn(n, generator=generator) for n in lengths]}


def run_dock_bench(
    workload: DockWorkload, client: Any, on_iteration: Callable[[int], None] | None = None
) -> DockBenchResult:
    """Run `workload.iterations` GRPO iterations through `client` (a GRPODock or its Ray client)."""
    import torch

    generator = torch.Generator().manual_seed(workload.seed)
    result = DockBenchResult()
    for iteration in range(workload.iterations):
        seed = workload.seed + iteration
        prompt_lengths = generate_lengths(
            Distribution.lognormal,
            workload.prompts,
            workload.prompt_length,
            1,
            4 * workload.prompt_length,
            seed,
        )
        response_lengths = generate_lengths(
            Distribution.lognormal,
            workload.rows,
            workload.response_length,
            1,
            4 * workload.response_length,
            seed,
        )
        prompts = [torch.randint(0, 32_000, (n,), generator=generator) for n in prompt_lengths]
        start = time.perf_counter()
        client.put_prompts(prompts, workload.n_samples)
        put = result.stages["put_prompts"]
        put.calls, put.rows = put.calls + 1, put.rows + workload.rows
        put.seconds += time.perf_counter() - start
        for consumer, columns, column, kind in STAGES:
            stats = result.stages[consumer]
            while True:
                began = time.perf_counter()
                batch = client.get(consumer, list(columns), workload.dispatch_size, layout=workload.layout)
                stats.seconds += time.perf_counter() - began
                if batch is None:
                    break
                stats.calls += 1
                stats.rows += len(batch)
                if column is not None:  # the random "compute" is made outside the timed calls
                    outputs = _outputs(kind, column, batch, response_lengths, generator)
                    began = time.perf_counter()
                    client.put(outputs, batch.indexes)
                    stats.seconds += time.perf_counter() - began
        result.bytes_stored = max(result.bytes_stored, client.metrics().get("dock/bytes_stored", 0.0))
        client.clear()
        result.iteration_seconds.append(time.perf_counter() - start)
        if on_iteration is not None:
            on_iteration(iteration + 1)
    return result
