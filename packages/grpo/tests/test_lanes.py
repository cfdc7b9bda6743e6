"""Micro-batches split over threads (`threads.lanes`): the same log-probs and update as one thread."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from test_update import ADVANTAGES, _config, _model, _rows

from entrepot.grpo import load_config
from entrepot.grpo.algo.optim import build_optimizer
from entrepot.grpo.algo.update import UpdateInputs, compute_logprobs, ppo_update
from entrepot.grpo.embedded import lanes as lanes_module
from entrepot.grpo.embedded.lanes import compute_lanes, run_lanes, split_rows
from entrepot.grpo.engines.registry import choose_engines
from entrepot.grpo.run.deployment import uses_ray


def test_split_rows_keeps_order_and_balances_tokens() -> None:
    lengths = torch.tensor([40, 2, 3, 2, 10, 10, 10, 10])
    rows = torch.tensor([7, 0, 1, 2, 3, 4, 5, 6])
    parts = split_rows(lengths, rows, 2)
    assert torch.cat(parts).tolist() == rows.tolist() and all(p.numel() for p in parts)
    assert [int(lengths[p].sum()) for p in parts] == [50, 37]  # cut where the tokens cross half (43.5)
    assert len(split_rows(lengths, rows[:1], 4)) == 1  # never an empty lane
    assert [p.tolist() for p in split_rows(lengths, rows, 1)] == [rows.tolist()]
    assert torch.cat(split_rows(lengths, rows, 8)).tolist() == rows.tolist()


def test_run_lanes_uses_threads_keeps_grad_mode_and_order_and_raises() -> None:
    def where(part: int) -> tuple[int, str, bool]:
        return part, threading.current_thread().name, torch.is_grad_enabled()

    with torch.no_grad():
        results = run_lanes(where, [0, 1, 2])
    assert [r[0] for r in results] == [0, 1, 2] and not any(r[2] for r in results)
    assert results[0][1] == threading.current_thread().name and results[2][1].startswith("entrepot-lane")

    def fails(part: int) -> int:
        if part == 1:
            raise ValueError("lane 1 failed")
        return part

    with pytest.raises(ValueError, match="lane 1 failed"):
        run_lanes(fails, [0, 1])


def test_run_lanes_called_from_a_lane_runs_its_parts_there(monkeypatch: pytest.MonkeyPatch) -> None:
    # A lane whose fn splits its own work again (e.g. a rollout engine with lanes, driven from lanes)
    # once waited forever: the pool's only thread was the one waiting.
    monkeypatch.setattr(lanes_module, "_pool", None)  # a fresh pool of one thread for the two parts below
    monkeypatch.setattr(lanes_module, "_pool_workers", 0)

    def inner(part: int) -> tuple[int, str]:
        return part, threading.current_thread().name

    def outer(part: int) -> list[tuple[int, str]]:
        return run_lanes(inner, [10 * part, 10 * part + 1])

    results: list[list[tuple[int, str]]] = []
    caller = threading.Thread(target=lambda: results.extend(run_lanes(outer, [0, 1])), daemon=True)
    caller.start()
    caller.join(timeout=60)
    assert not caller.is_alive(), "run_lanes inside a lane deadlocked"
    assert [[part for part, _ in lane] for lane in results] == [[0, 1], [10, 11]]
    names = {name for _, name in results[1]}  # lane 1's own parts: all on its thread
    assert len(names) == 1 and names.pop().startswith("entrepot-lane")


def test_two_lanes_give_the_log_probs_and_update_of_one() -> None:
    config = _config("algorithm.kl_coef=0")
    batch = _rows([5, 4, 6, 5, 3, 7], [40, 2, 3, 2, 9, 12])
    ref = {lanes: compute_logprobs(_model(config), batch, config.batching, "ref_log_prob", lanes=lanes)
           for lanes in (1, 2)}  # fmt: skip
    torch.testing.assert_close(ref[2], ref[1], atol=1e-6, rtol=0)
    advantages = torch.cat([ADVANTAGES, torch.tensor([0.5, -0.25])])
    out = {}
    for lanes in (1, 2):
        model = _model(config)
        optimizer, scheduler = build_optimizer(model, config.algorithm, total_steps=10)
        inputs = UpdateInputs(batch, advantages, None, None, [torch.arange(batch.num_rows)])
        metrics = ppo_update(
            model, optimizer, scheduler, inputs, config.algorithm, config.batching, lanes=lanes
        )
        out[lanes] = ({n: p.grad.clone() for n, p in model.named_parameters()}, metrics)
    for name, grad in out[1][0].items():
        torch.testing.assert_close(out[2][0][name], grad, atol=1e-6, rtol=1e-5, msg=name)
    assert out[2][1]["pg_loss"] == pytest.approx(out[1][1]["pg_loss"], abs=1e-6)
    assert out[2][1]["micro_batches"] == out[1][1]["micro_batches"] == 1  # lanes split inside a micro-batch


def _lanes(overrides: list[str], cores: int | None = None) -> int:
    config = load_config(None, overrides)
    on_ray = uses_ray(config.resources, config.parallel, config.dock, environ={})
    splits = choose_engines(config.engine).train.lanes
    return compute_lanes(
        config.threads, device=config.engine.device, splits=splits, on_ray=on_ray, cores=cores
    )


def test_lanes_default_to_two_cores_in_one_process_only() -> None:
    assert _lanes([]) == min(2, len(os.sched_getaffinity(0)))  # this machine's cores, read at the call
    assert _lanes([], cores=8) == 2 and _lanes([], cores=1) == 1
    assert _lanes(["resources.use_ray=true"], cores=8) == 1
    assert _lanes(["engine.device=cuda"], cores=8) == 1
    assert _lanes(["threads.lanes=3"], cores=1) == 3
