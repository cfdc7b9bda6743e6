"""Our AdamW and LR schedule against torch.optim's AdamW and LambdaLR, the update they reproduce."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
import sys

import pytest
import torch

from entrepot.grpo.algo.optim import AdamW, LRSchedule, lr_lambda

SCHEDULE = functools.partial(lr_lambda, warmup_steps=2, total_steps=6, schedule="cosine")


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))


def _train(model: torch.nn.Module, optimizer: object, scheduler: object, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)  # type: ignore[attr-defined]
        loss = model(torch.randn(5, 8, generator=generator)).pow(2).mean()
        loss.backward()
        optimizer.step()  # type: ignore[attr-defined]
        scheduler.step()  # type: ignore[attr-defined]


def _torch_pair(
    model: torch.nn.Module, **kwargs: object
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LRScheduler]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95), weight_decay=0.1, **kwargs)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, SCHEDULE)


def _ours(model: torch.nn.Module) -> tuple[AdamW, LRSchedule]:
    optimizer = AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.95), weight_decay=0.1)
    return optimizer, LRSchedule(optimizer, SCHEDULE)


def test_fused_steps_equal_torch_adamw_with_its_schedule() -> None:
    theirs, ours = _model(), _model()
    t_opt, t_sched = _torch_pair(theirs, fused=True)
    o_opt, o_sched = _ours(ours)
    assert o_opt.fused
    for _ in range(6):  # warm-up, then cosine: the lr changes every step
        _train(theirs, t_opt, t_sched, 1)
        _train(ours, o_opt, o_sched, 1)
        assert o_sched.get_last_lr() == t_sched.get_last_lr()
        for a, b in zip(theirs.parameters(), ours.parameters(), strict=True):
            assert torch.equal(a, b)
    for a, b in zip(t_opt.state.values(), o_opt.state.values(), strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_plain_steps_equal_torch_single_tensor_adamw() -> None:
    """The path for devices the fused kernel does not take (forced here on CPU)."""
    theirs, ours = _model(), _model()
    t_opt, t_sched = _torch_pair(theirs, foreach=False)
    o_opt, o_sched = _ours(ours)
    o_opt.fused = False
    _train(theirs, t_opt, t_sched, 5)
    _train(ours, o_opt, o_sched, 5)
    for a, b in zip(theirs.parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)


def test_a_torch_checkpoint_loads_and_training_continues_alike() -> None:
    """State saved by torch.optim.AdamW + LambdaLR (older checkpoints) loads into ours."""
    theirs, ours = _model(), _model()
    t_opt, t_sched = _torch_pair(theirs, fused=True)
    _train(theirs, t_opt, t_sched, 3)
    ours.load_state_dict(theirs.state_dict())
    o_opt, o_sched = _ours(ours)
    o_opt.load_state_dict(copy.deepcopy(t_opt.state_dict()))  # torch's holds its live tensors
    scheduler_state = {k: v for k, v in t_sched.state_dict().items() if k != "lr_lambdas"}
    o_sched.load_state_dict({**o_sched.state_dict(), **scheduler_state})
    assert o_opt.param_groups[0]["lr"] == t_opt.param_groups[0]["lr"]
    _train(theirs, t_opt, t_sched, 3, seed=2)
    _train(ours, o_opt, o_sched, 3, seed=2)
    for a, b in zip(theirs.parameters(), ours.parameters(), strict=True):
        assert torch.equal(a, b)


def test_state_dict_round_trip_and_a_mismatch_is_refused() -> None:
    model = _model()
    optimizer, scheduler = _ours(model)
    _train(model, optimizer, scheduler, 2)
    state = optimizer.state_dict()
    assert sorted(state["state"]) == list(range(4)) and state["param_groups"][0]["params"] == [0, 1, 2, 3]
    fresh, _ = _ours(_model())
    fresh.load_state_dict(state)
    pairs = zip(optimizer.state.values(), fresh.state.values(), strict=True)
    assert all(torch.equal(a["exp_avg"], b["exp_avg"]) for a, b in pairs)
    smaller = AdamW(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(ValueError, match="one group of 2"):
        smaller.load_state_dict(state)
    with pytest.raises(ValueError, match="no parameters"):
        AdamW([], lr=0.1)


def test_zero_grad_without_set_to_none_zeroes_in_place() -> None:
    model = _model()
    optimizer, scheduler = _ours(model)
    _train(model, optimizer, scheduler, 1)
    model(torch.ones(1, 8)).sum().backward()
    grads = [p.grad for p in model.parameters()]
    optimizer.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.any() for p, g in zip(model.parameters(), grads, strict=True))


@pytest.mark.integration  # a fresh interpreter (subprocess)
def test_stepping_does_not_import_dynamo() -> None:
    """Why the class exists: torch.optim's optimizers import torch._dynamo (seconds of start-up)."""
    script = (
        "import sys, torch\n"
        "from entrepot.grpo.algo.optim import AdamW, LRSchedule\n"
        "p = torch.nn.Parameter(torch.ones(3)); o = AdamW([p], lr=0.1); s = LRSchedule(o, lambda step: 1.0)\n"
        "p.sum().backward(); o.step(); s.step(); o.zero_grad(); o.load_state_dict(o.state_dict())\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
