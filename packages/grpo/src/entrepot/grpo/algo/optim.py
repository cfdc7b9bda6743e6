"""The optimiser and LR schedule of the policy: AdamW, linear warm-up, then constant or cosine.

Both are ours rather than torch.optim's: building or stepping any `torch.optim.Optimizer` imports
`torch._dynamo` (its methods carry a lazy dynamo-disable), a large import that a trainer which never
compiles should not pay at start-up. The update is torch's AdamW (decoupled weight
decay, bias correction; tested equal to `torch.optim.AdamW` step for step) through the same fused
kernel, and the `state_dict` layouts are torch's, so checkpoints saved with torch.optim's classes load.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from entrepot.grpo.config import AlgorithmConfig, RolloutConfig

__all__ = ["AdamW", "LRSchedule", "build_optimizer", "lr_lambda", "total_optimizer_steps"]

_GROUP_KEYS = ("lr", "betas", "eps", "weight_decay", "initial_lr")


class AdamW:
    """AdamW over one parameter group, stepped like `torch.optim.AdamW(fused=True)` where it can be.

    CPU and CUDA floating-point parameters go through torch's fused AdamW kernel (one kernel per
    tensor instead of about a dozen small ops each); others (an NPU) through the same update in
    plain tensor ops. What callers read is laid out as torch's: `param_groups` (one dict: params,
    lr, betas, eps, weight_decay, initial_lr) and `state` (parameter -> step, exp_avg, exp_avg_sq).

    Args:
        params: the trained parameters.
        lr, betas, eps, weight_decay: as `torch.optim.AdamW`'s.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        *,
        lr: float,
        betas: Sequence[float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        params = list(params)
        if not params:
            raise ValueError("AdamW got no parameters to train")
        beta1, beta2 = betas
        self.param_groups: list[dict[str, Any]] = [
            {"params": params, "lr": float(lr), "betas": (float(beta1), float(beta2)), "eps": float(eps),
             "weight_decay": float(weight_decay), "initial_lr": float(lr)}
        ]  # fmt: skip
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        self.fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)

    @property
    def _params(self) -> list[torch.Tensor]:
        return self.param_groups[0]["params"]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (or zero them in place), as `torch.optim.Optimizer.zero_grad`."""
        for param in self._params:
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
                continue
            if param.grad.grad_fn is not None:
                param.grad.detach_()
            else:
                param.grad.requires_grad_(False)
            param.grad.zero_()

    def _state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state.get(param)
        if not state:  # the moments appear with the first step, as torch's
            step_device = param.device if self.fused else torch.device("cpu")
            state = self.state[param] = {
                "step": torch.zeros((), dtype=torch.float32, device=step_device),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
            }
        return state

    @torch.no_grad()
    def step(self) -> None:
        """One AdamW step of every parameter that has a gradient."""
        group = self.param_groups[0]
        lr, (beta1, beta2), eps, decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        pairs = [(p, p.grad) for p in self._params if p.grad is not None]
        if not self.fused:
            for param, grad in pairs:
                _plain_step(param, grad, self._state(param), lr, beta1, beta2, eps, decay)
            return
        by_kind: dict[tuple[torch.device, torch.dtype], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for param, grad in pairs:  # the fused kernel takes tensors of one device and dtype per call
            by_kind.setdefault((param.device, param.dtype), []).append((param, grad))
        for same in by_kind.values():
            params, grads = [p for p, _ in same], [g for _, g in same]
            states = [self._state(p) for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            torch._fused_adamw_(
                params, grads, [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=lr, beta1=beta1,
                beta2=beta2, weight_decay=decay, eps=eps, maximize=False, grad_scale=None, found_inf=None,
            )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """torch's layout: state by parameter index, param_groups with indexes for params."""
        index = {param: i for i, param in enumerate(self._params)}
        group = {key: value for key, value in self.param_groups[0].items() if key != "params"}
        return {
            "state": {index[param]: dict(state) for param, state in self.state.items() if state},
            "param_groups": [{**group, "params": list(range(len(self._params)))}],
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load `state_dict` (ours or a `torch.optim.AdamW`'s over the same parameters)."""
        groups = state_dict["param_groups"]
        if len(groups) != 1 or len(groups[0]["params"]) != len(self._params):
            sizes = [len(g["params"]) for g in groups]
            raise ValueError(f"optimizer state has param groups of {sizes} parameters; this AdamW has "
                             f"one group of {len(self._params)}")  # fmt: skip
        saved = groups[0]
        for key in _GROUP_KEYS:
            if key in saved:
                self.param_groups[0][key] = tuple(saved[key]) if key == "betas" else saved[key]
        self.state = {}
        for index, values in state_dict["state"].items():
            param = self._params[int(index)]
            self.state[param] = {key: self._placed(param, key, value) for key, value in values.items()}

    def _placed(self, param: torch.Tensor, key: str, value: torch.Tensor) -> torch.Tensor:
        """A loaded state tensor where `step` would put it (torch's rule: the step count on the
        parameter's device for the fused kernel, the moments in the parameter's dtype and device)."""
        if key == "step":
            return value.to(dtype=torch.float32, device=param.device) if self.fused else value
        return value.to(dtype=param.dtype, device=param.device)


def _plain_step(
    param: torch.Tensor, grad: torch.Tensor, state: dict[str, torch.Tensor],
    lr: float, beta1: float, beta2: float, eps: float, decay: float,
) -> None:  # fmt: skip
    """torch's single-tensor AdamW update of one parameter."""
    state["step"] += 1
    step = float(state["step"])
    param.mul_(1 - lr * decay)
    state["exp_avg"].lerp_(grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - beta2**step)).add_(eps)
    param.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1**step))


class LRSchedule:
    """The group's lr set to ``initial_lr * lr_lambda(step)`` at start and after each optimiser step.

    torch's `LambdaLR` over our `AdamW`; `state_dict` keeps LambdaLR's keys (a saved LambdaLR's load).
    """

    def __init__(self, optimizer: AdamW, lr_lambda: Callable[[int], float]) -> None:
        self.optimizer, self.lr_lambda = optimizer, lr_lambda
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = 0
        self._last_lr = self._apply()

    def _apply(self) -> list[float]:
        factor = self.lr_lambda(self.last_epoch)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base * factor
        return [group["lr"] for group in self.optimizer.param_groups]

    def step(self) -> None:
        """Advance one optimiser step and set the lr it trains with."""
        self.last_epoch += 1
        self._last_lr = self._apply()

    def get_last_lr(self) -> list[float]:
        return list(self._last_lr)

    def state_dict(self) -> dict[str, Any]:
        return {"base_lrs": list(self.base_lrs), "last_epoch": self.last_epoch,
                "_step_count": self.last_epoch + 1, "_last_lr": list(self._last_lr)}  # fmt: skip

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Where the schedule stands; the lr itself comes back with the optimizer's param groups."""
        self.base_lrs = list(state_dict["base_lrs"])
        self.last_epoch = int(state_dict["last_epoch"])
        self._last_lr = list(state_dict.get("_last_lr", self._last_lr))


def build_optimizer(
    model: torch.nn.Module, algo: AlgorithmConfig, total_steps: int
) -> tuple[AdamW, LRSchedule]:
    """AdamW with the configured LR, betas and weight decay, plus the warm-up / cosine schedule.

    Args:
        model: the trainable module (parameters with requires_grad).
        algo: the `algorithm` section.
        total_steps: optimiser steps of the whole run (for the cosine schedule).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = AdamW(params, lr=algo.lr, betas=algo.adam_betas, weight_decay=algo.weight_decay)
    schedule = functools.partial(
        lr_lambda, warmup_steps=algo.warmup_steps, total_steps=total_steps, schedule=algo.lr_schedule
    )
    return optimizer, LRSchedule(optimizer, schedule)


def total_optimizer_steps(max_steps: int, algorithm: AlgorithmConfig, rollout: RolloutConfig) -> int:
    """Optimiser steps of the whole run (the cosine schedule's length).

    Args:
        max_steps: GRPO steps of the run.
        algorithm: the `algorithm` section (epochs, mini-batch size).
        rollout: the `rollout` section (rows per step).
    """
    mini = algorithm.mini_batch_size or rollout.batch_size
    return max_steps * algorithm.epochs * max(1, rollout.batch_size // mini)


def lr_lambda(step: int, *, warmup_steps: int, total_steps: int, schedule: str = "constant") -> float:
    """LR multiplier at optimiser step `step`: linear warm-up, then constant or cosine to 0."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
