"""Spawned ranks of the megatron tests (imported by name in each child process).

Each rank builds the embedded GPT-2 policy, loads it into megatron-core at the asked TP / PP on
gloo, and compares with the HF module in the same process: log-probs of random rows and the
parameters after one clipped PPO update (megatron's shard vs the same slice of the HF update).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from entrepot.grpo.algo.optim import build_optimizer
from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.algo.update import UpdateInputs, ppo_update
from entrepot.grpo.config import load_config
from entrepot.grpo.engines.megatron import MegatronTrainer, init_model_parallel
from entrepot.grpo.engines.models import build_model

VOCAB = 14


def _rows(seed: int = 3, num_rows: int = 8) -> ResponseBatch:
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(3, 9, (num_rows,), generator=g)
    response_lengths = torch.randint(1, 9, (num_rows,), generator=g)
    prompts = torch.randint(0, VOCAB, (int(prompt_lengths.sum()),), generator=g)
    responses = torch.randint(0, VOCAB, (int(response_lengths.sum()),), generator=g)
    return ResponseBatch.from_packed(prompts, prompt_lengths, responses, response_lengths)


def compare_with_hf(
    rank: int, world: int, tp: int, pp: int, port: int, out: str, model: tuple[str, ...] = ()
) -> None:
    """Write {logp_diff, param_diff} of this rank (param_diff after one update) to `out`/rank.json.

    `model`: overrides of the model section (the default GPT-2 when empty).
    """
    torch.set_num_threads(1)
    overrides = ["engine.train=megatron", f"parallel.train.tensor={tp}", f"parallel.train.pipeline={pp}",
                 "algorithm.kl_coef=0.0", "batching.max_tokens_per_micro_batch=40", "algorithm.grad_clip=0.5",
                 *model]  # fmt: skip
    config = load_config(None, overrides)
    init_model_parallel(config.parallel.train, config.engine.device, config.seed, rank, world,
                        f"tcp://127.0.0.1:{port}")  # fmt: skip
    torch.manual_seed(0)
    hf = build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)
    single = copy.deepcopy(hf)
    trainer = MegatronTrainer(config, hf)
    batch = _rows()
    result: dict[str, float] = {}
    logp = trainer.logprobs(batch, "old_log_prob", reference=False)
    if logp is not None:  # the last pipeline stage
        with torch.no_grad():
            expected, _ = response_logprobs(single, batch, packed=True)
        result["logp_diff"] = float((logp - expected).abs().max())
    advantages = torch.randn(batch.num_rows, generator=torch.Generator().manual_seed(5))
    inputs = UpdateInputs(batch, advantages, None, None, [torch.arange(batch.num_rows)])
    metrics = trainer.update(inputs)
    optimizer, scheduler = build_optimizer(single, config.algorithm, 300)
    expected_metrics = ppo_update(single, optimizer, scheduler, inputs, config.algorithm, config.batching)
    full = trainer.adaptor.hf_to_train({n: p.detach() for n, p in single.state_dict().items()})
    coords = trainer.train_engine.layout.coords(rank, world)
    shard = trainer.adaptor.shard(full, trainer.train_engine.layout, tp_rank=coords.tp_rank,
                                  pp_rank=coords.pp_rank)  # fmt: skip
    mine = trainer.named_parameters()
    result["param_diff"] = max(float((mine[n] - shard[n]).abs().max()) for n in mine)
    result["grad_norm_diff"] = abs(metrics["grad_norm"] - expected_metrics["grad_norm"])
    Path(out, f"{rank}.json").write_text(json.dumps(result))


LOSS_CASES = (
    ("ppo_clip", "token-mean", False, False), ("gspo", "seq-mean-token-mean", False, False),
    ("cispo", "token-mean", False, False), ("ppo_clip", "seq-mean-token-sum-norm", True, False),
    ("ppo_clip", "token-mean", False, True), ("gspo", "seq-mean-token-mean", False, True),
)  # fmt: skip
"""(algorithm.loss, algorithm.loss_agg, mask a truncated row, multi-turn rows: every third response token
the environment's): the loss family's cases."""


def compare_losses_with_hf(rank: int, world: int, port: int, out: str) -> None:
    """Per `LOSS_CASES` case, {param_diff, grad_norm_diff, pg_loss_diff} of one off-policy update at TP2.

    The old log-probs are shifted from the current ones (ratios over [0.7, 1.4]), so clipping and
    the surrogates' differences show; the torch engine's `ppo_update` on the HF module is the reference.
    """
    torch.set_num_threads(1)
    parallel = load_config(None, ["engine.train=megatron", "parallel.train.tensor=2"]).parallel.train
    init_model_parallel(parallel, "cpu", 0, rank, world, f"tcp://127.0.0.1:{port}")
    results: dict[str, dict[str, float]] = {}
    batch = _rows()
    advantages = torch.randn(batch.num_rows, generator=torch.Generator().manual_seed(5))
    for loss, agg, mask, env in LOSS_CASES:
        config = load_config(None, [
            "engine.train=megatron", "parallel.train.tensor=2", "algorithm.kl_coef=0.0",
            "batching.max_tokens_per_micro_batch=40", "algorithm.grad_clip=null", f"algorithm.loss={loss}",
            f"algorithm.loss_agg={agg}", "algorithm.clip_low=0.1", "algorithm.clip_high=0.1",
        ])  # fmt: skip
        torch.manual_seed(0)
        hf = build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1)
        single = copy.deepcopy(hf)
        trainer = MegatronTrainer(config, hf)
        with torch.no_grad():
            current, _ = response_logprobs(single, batch, packed=True)
        old = current - torch.linspace(-0.35, 0.35, current.numel())
        keep = torch.ones(batch.num_rows, dtype=torch.bool)
        keep[1] = not mask
        model_mask = torch.arange(current.numel()) % 3 != 1 if env else None  # [R]
        inputs = UpdateInputs(batch, advantages, old, None, [torch.arange(batch.num_rows)], horizon=9,
                              keep=keep if mask else None, model_mask=model_mask)  # fmt: skip
        metrics = trainer.update(inputs)
        optimizer, scheduler = build_optimizer(single, config.algorithm, 300)
        expected = ppo_update(single, optimizer, scheduler, inputs, config.algorithm, config.batching)
        full = trainer.adaptor.hf_to_train({n: p.detach() for n, p in single.state_dict().items()})
        coords = trainer.train_engine.layout.coords(rank, world)
        shard = trainer.adaptor.shard(full, trainer.train_engine.layout, tp_rank=coords.tp_rank,
                                      pp_rank=coords.pp_rank)  # fmt: skip
        mine = trainer.named_parameters()
        results[f"{loss}/{agg}/{mask}/{env}"] = {
            "param_diff": max(float((mine[n] - shard[n]).abs().max()) for n in mine),
            "grad_norm_diff": abs(metrics["grad_norm"] - expected["grad_norm"]),
            "pg_loss_diff": abs(metrics["pg_loss"] - expected["pg_loss"]),
            "clip_frac": expected["clip_frac"],
        }
    Path(out, f"{rank}.json").write_text(json.dumps(results))


def compare_in_one_world(rank: int, world: int, port: int, out: str, cases: list[list]) -> None:  # type: ignore[type-arg]
    """`compare_with_hf` for each of `cases` ([name, tp, pp, model overrides], tp x pp == `world`), then
    `compare_losses_with_hf` (name "losses"), one after another in this one spawned world: each writes
    into `out`/name/. `init_model_parallel` keeps the process group and builds megatron's parallel
    state afresh at each case's layout, so a world pays its start-up (imports, gloo) once.
    """
    import traceback

    for name, tp, pp, model in [*cases, ["losses", None, None, None]]:
        where = Path(out, name)
        where.mkdir(parents=True, exist_ok=True)
        try:
            if name == "losses":
                compare_losses_with_hf(rank, world, port, str(where))
            else:
                compare_with_hf(rank, world, tp, pp, port, str(where), tuple(model))
        except Exception:  # recorded for the case's test; the world stops (the ranks' collectives pair up)
            Path(where, f"{rank}.error").write_text(traceback.format_exc())
            raise
