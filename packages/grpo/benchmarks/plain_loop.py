"""GRPO in one process with no dock, no workers and no Ray: the baseline of the benchmark.

It builds the same `Policy` (model, reference, optimizer, rollout engine, sampling stream) as an
actor worker of rank 0 and runs the same update code (`entrepot.grpo.algo.update`), so with one worker
and the same seed its first step equals the full system's (tests/test_plain_parity.py), and the
benchmark's time ratio measures only the dock + worker-group + Ray machinery. Not supported: DP,
dynamic sampling, kl_in_reward, checkpoints (the full system has them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from entrepot.grpo.algo.losses import group_advantages
from entrepot.grpo.algo.sequences import ResponseBatch
from entrepot.grpo.algo.update import UpdateInputs
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data import rewards
from entrepot.grpo.data.sources import encode_prompt
from entrepot.grpo.embedded.threads import configure_threads
from entrepot.grpo.engines.policy import Policy, build_policy
from entrepot.grpo.evaluation.greedy import greedy_eval

__all__ = ["plain_step", "run_plain"]


def _rows(policy: Policy, config: GRPOConfig, step: int) -> tuple[ResponseBatch, list[str]]:
    """Generate the step's responses; returns the rows (prompt + response) and each row's answer."""
    n, count = config.rollout.n_samples_per_prompt, config.rollout.prompts_per_step
    samples = policy.setup.source.batch(step * count, count)
    prompts = [
        torch.tensor(encode_prompt(policy.setup, s.prompt, config.data.max_prompt_tokens)) for s in samples
    ]
    repeated = [p for p in prompts for _ in range(n)]
    pad = policy.setup.tokenizer.pad_token_id
    policy.manager.enter_infer_mode()
    out = policy.engine.generate(repeated, policy.sampling, pad_token_id=pad, generator=policy.generator)
    policy.manager.exit_infer_mode()
    batch = ResponseBatch.from_packed(torch.cat(repeated), torch.tensor([len(p) for p in repeated]),
                                      out.tokens, out.lengths)  # fmt: skip
    return batch, [s.answer for s in samples for _ in range(n)]


def plain_step(policy: Policy, config: GRPOConfig, step: int) -> dict[str, float]:
    """One GRPO step in this process: generate, score, reference log-probs, advantages, update."""
    algo, tok = config.algorithm, policy.setup.tokenizer
    t0 = time.perf_counter()
    batch, answers = _rows(policy, config, step)
    t1 = time.perf_counter()
    rows = torch.split(batch.tokens, batch.lengths.tolist())
    texts = [
        tok.decode(ids[int(p) :].tolist(), skip_special_tokens=True)
        for ids, p in zip(rows, batch.prompt_lengths, strict=True)
    ]
    scores = torch.tensor(rewards.score(texts, answers, config.reward.verifiers))
    t2 = time.perf_counter()
    ref = None
    if algo.kl_coef > 0:
        ref = policy.trainer.logprobs(batch, "ref_log_prob", reference=True)
    t3 = time.perf_counter()
    advantages = group_advantages(
        scores, config.rollout.n_samples_per_prompt, normalize_std=algo.normalize_std
    )
    mini = algo.mini_batch_size or batch.num_rows
    minis = list(torch.split(torch.arange(batch.num_rows), mini))
    old = None
    if algo.epochs > 1 or len(minis) > 1:
        old = policy.trainer.logprobs(batch, "old_log_prob", reference=False)
    inputs = UpdateInputs(batch, advantages, old, ref, minis)
    update = policy.trainer.update(inputs)
    t4 = time.perf_counter()
    return {
        "reward_mean": float(scores.mean()),
        "time/rollout": t1 - t0,
        "time/reward": t2 - t1,
        "time/ref": t3 - t2,
        "time/update": t4 - t3,
        "time/step": t4 - t0,
        **update,
    }


def run_plain(
    config: GRPOConfig, *, on_step: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Train `config` in this process; returns one metrics dict per step (eval keys on eval steps)."""
    configure_threads(config.threads)
    policy = build_policy(config)
    history: list[dict[str, Any]] = []
    start = time.perf_counter()
    for step in range(config.max_steps):
        metrics: dict[str, Any] = {"step": step + 1, **plain_step(policy, config, step)}
        if (config.eval.every and (step + 1) % config.eval.every == 0) or step + 1 == config.max_steps:
            policy.manager.enter_infer_mode()
            metrics.update(greedy_eval(policy.engine, policy.setup, config.reward, config.eval.num_prompts,
                                       max_prompt_tokens=config.data.max_prompt_tokens))  # fmt: skip
            policy.manager.exit_infer_mode()
        metrics["elapsed"] = time.perf_counter() - start
        history.append(metrics)
        if on_step is not None:
            on_step(metrics)
        target = config.eval.target_accuracy
        if target is not None and metrics.get("accuracy", 0.0) >= target:
            break
    return history
