"""GRPO in one process with no dock, no Ray and no resharder: the readable reference and the baseline.

What is simplified compared with the full system (`trainer.py`): every stage runs in this process
on local lists; the rollout engine gets its weights by a direct HF -> inference-layout copy; no
checkpoints. The maths (rewards, advantages, losses, updates) is the same code the workers run, so
the benchmark's overhead ratio measures only the dock + Ray + resharding machinery.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch

from entrepot.grpo import rewards
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.data import build_task
from entrepot.grpo.evaluation import greedy_eval
from entrepot.grpo.model import build_model
from entrepot.grpo.rollout import GPT2RolloutEngine, SamplingParams, gpt2_hf_to_infer
from entrepot.grpo.stages import actor_update, compute_logprobs, make_token_batch, shaped_advantages
from entrepot.grpo.threads import configure_threads
from entrepot.grpo.training import build_optimizer, encode_group_prompts, keep_rows

__all__ = ["run_plain"]


def run_plain(
    config: GRPOConfig, *, on_step: Callable[[dict[str, Any]], None] | None = None
) -> list[dict[str, Any]]:
    """Train `config` in this process; returns one metrics dict per step (eval keys on eval steps)."""
    configure_threads(config.threads)
    torch.manual_seed(config.seed)
    setup = build_task(config)
    tok = setup.tokenizer
    model = build_model(
        config.model, tok.vocab_size, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    reference = copy.deepcopy(model).requires_grad_(False) if config.algorithm.kl_coef > 0 else None
    engine = GPT2RolloutEngine.from_hf_config(model.config)
    optimizer, scheduler = build_optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)
    params = SamplingParams(
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        top_k=config.rollout.top_k,
        max_new_tokens=setup.max_new_tokens,
        stop_token_ids=(tok.eos_token_id,) if config.rollout.stop_on_eos else (),
    )
    n = config.rollout.n_samples_per_prompt
    history: list[dict[str, Any]] = []
    start = time.perf_counter()
    for step in range(config.max_steps):
        t0 = time.perf_counter()
        engine.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
        samples = setup.source.batch(step * config.rollout.prompts_per_step, config.rollout.prompts_per_step)
        prompt_ids, answers = encode_group_prompts(setup, samples, n, config.data.max_prompt_tokens)
        responses = engine.generate(prompt_ids, params, pad_token_id=tok.pad_token_id, generator=generator)
        t1 = time.perf_counter()
        texts = [tok.decode(r, skip_special_tokens=True) for r in responses]
        scores = torch.tensor(rewards.score(texts, answers, config.reward.verifiers))
        batch = make_token_batch(prompt_ids, responses, tok.pad_token_id)
        t2 = time.perf_counter()
        ref_logp = compute_logprobs(reference, batch, config.batching) if reference is not None else None
        t3 = time.perf_counter()
        advantages = shaped_advantages(
            scores,
            n,
            config.algorithm,
            ref_logp=ref_logp,
            response_mask=batch.response_mask,
            logp=compute_logprobs(model, batch, config.batching) if config.algorithm.kl_in_reward else None,
        )
        keep = keep_rows(scores, n, config.algorithm.dynamic_sampling)
        update = {}
        if keep:
            update = actor_update(
                model,
                optimizer,
                scheduler,
                batch.rows(keep),
                advantages[keep],
                None,
                None if ref_logp is None else ref_logp[keep],
                config.algorithm,
                config.batching,
                mini_batch_size=config.algorithm.mini_batch_size,
            )
        t4 = time.perf_counter()
        metrics: dict[str, Any] = {
            "step": step + 1,
            "reward_mean": float(scores.mean()),
            "reward_std": float(scores.std()),
            "response_length": float(batch.response_lengths.float().mean()),
            "time/rollout": t1 - t0,
            "time/reward": t2 - t1,
            "time/ref": t3 - t2,
            "time/update": t4 - t3,
            "time/step": t4 - t0,
            **update,
        }
        if (config.eval.every and (step + 1) % config.eval.every == 0) or step + 1 == config.max_steps:
            engine.load_weights(gpt2_hf_to_infer(dict(model.state_dict())))
            metrics.update(greedy_eval(engine, setup, config))
        metrics["elapsed"] = time.perf_counter() - start
        history.append(metrics)
        if on_step is not None:
            on_step(metrics)
        target = config.eval.target_accuracy
        if target is not None and metrics.get("accuracy", 0.0) >= target:
            break
    return history
