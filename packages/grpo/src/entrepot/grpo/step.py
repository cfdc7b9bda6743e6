"""One GRPO step through the dock, top to bottom (`GRPOStep.__call__` reads in this order):

    1-3. sample: put prompts (n samples each) -> rollout (actor in infer mode) -> [reward models]
         -> rule reward; the sampling mode (`sampling.py`) decides which rows the step trains
         (asynchronous training: the next finished groups of the rollout running beside the step)
    4-5. reference -> old (skipped when provably equal to the current ones: one epoch, one
         mini-batch) -> [teacher] log-probs; in the rollout's phase, or after it when the rows change
    6.   advantages (in the driver; `algorithm.advantage` chooses the estimator; distillation: per token)
    7.   actor update: each DP rank trains the rows planned for it, gradients summed over ranks
    8.   metrics, a few samples (step 1, then every `logging.samples_every`), evaluation, clear

Every stage is a dock consumer on a worker group (`entrepot.grpo.workers`): the step calls typed methods
on groups and never asks whether they are Ray actors or objects in this process. With `resources.blocking`
each stage waits for the previous one; without it the stages of a phase start together and wait in the
dock for their inputs, and the first failure fails the step (`StageError`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from entrepot.grpo.algo.advantages import choose_estimator
from entrepot.grpo.algo.losses import row_sums, sequence_kl
from entrepot.grpo.asynchronous import AsyncSampling
from entrepot.grpo.audit import AuditTracker
from entrepot.grpo.config import GRPOConfig
from entrepot.grpo.config.correction import resolve as resolve_correction
from entrepot.grpo.data import code_tests, rewards
from entrepot.grpo.data.sources import TaskSetup, encode_prompt
from entrepot.grpo.engines.registry import choose_engines
from entrepot.grpo.multiturn import EndReason
from entrepot.grpo.run.metrics import dock_step_metrics, merge_rank_metrics
from entrepot.grpo.run.samples import add_judgements, build_samples, pick_rows, samples_due
from entrepot.grpo.sampling import Sampling, StageStart, choose_sampling
from entrepot.grpo.workers import (
    JUDGE_COLUMNS,
    ActorWorker,
    Cluster,
    Pending,
    ReferenceWorker,
    RewardModelWorker,
    RewardWorker,
    prompt_extras,
    tensor_text,
    wait_all,
)
from entrepot.grpo.workers._teacher import DISTILL_COLUMNS, TOKEN_ADVANTAGES, distill_advantages

__all__ = ["PROMPTS_KEY", "SAMPLES_KEY", "GRPOStep"]

SAMPLES_KEY = "samples"  # the step's sample records (`run.samples`), on sampled steps only; not a metric
PROMPTS_KEY = "trained_prompts"  # data positions of the prompts a step trained (asynchronous); not a metric


class GRPOStep:
    """Runs GRPO steps of `cluster` (the dock and the worker groups) for the trainer.

    Args:
        config: the run's config; the step keeps the sections it reads.
        cluster: the dock and the worker groups (`workers.launch`).
        setup: tokenizer and prompt source.

    Attributes:
        sampling: the sampling mode, chosen once (`data_position`: the prompts it drew so far).

    The first step, and a step whose number is a multiple of `logging.samples_every`, also return a few
    of its rows as sample records (prompt, response, reward, per-verifier parts) under `SAMPLES_KEY`.
    """

    def __init__(self, config: GRPOConfig, cluster: Cluster, setup: TaskSetup) -> None:
        self.rollout, self.algorithm, self.batching = config.rollout, config.algorithm, config.batching
        self.resources, self.reward, self.eval = config.resources, config.reward, config.eval
        self.logging = config.logging
        self.multiturn = config.multiturn.enabled
        self._judged = list(JUDGE_COLUMNS) if config.reward.judge.enabled else []
        self.max_prompt_tokens, self.max_steps = config.data.max_prompt_tokens, config.max_steps
        self.separate_kernels = choose_engines(config.engine).rollout.separate_kernels
        self.cluster, self.dock, self.setup = cluster, cluster.dock, setup
        self.actors, self.rewards = cluster.actors, cluster.rewards
        self.sampling: Sampling = (
            AsyncSampling.build(config, cluster) if config.trainer.asynchronous
            else choose_sampling(config.rollout, config.algorithm)
        )  # fmt: skip
        self.correction = resolve_correction(config.algorithm.correction, config.trainer.asynchronous)
        algo = config.algorithm
        self.estimator = choose_estimator(algo.advantage, normalize_std=algo.normalize_std)
        self._data_position = 0
        self._dock_totals: dict[str, float] = {}
        self.audit = AuditTracker(config.audit, config.data.task) if config.audit.enabled else None
        if self.logging.samples_every:  # the parts score here too (the reward workers may be elsewhere)
            rewards.resolve_custom(config.reward.custom)
            code_tests.configure(config.reward.code)

    @property
    def data_position(self) -> int:
        """Prompts drawn from the data stream so far (a checkpoint saves it)."""
        drawn = self.sampling.data_position
        return self._data_position if drawn is None else drawn

    def restored(self, data_position: int) -> None:
        """Continue after the trainer loaded a checkpoint: its prompt position, and the dock's counters
        as they stood then (cumulative over the run), so that the next step reports only its own."""
        self._data_position = data_position
        dock_step_metrics(self.dock.metrics(), self._dock_totals)

    def __call__(self, step: int) -> dict[str, Any]:
        """Step `step` + 1 (policy version `step` samples); returns its metrics."""
        n = self.rollout.n_samples_per_prompt
        t_start = time.perf_counter()

        # 1-3. prompts -> rollout -> reward (the log-prob stages join this phase unless the rows change)
        alongside = (
            [] if self.sampling.log_probs_after else self._log_prob_stages(self.rollout.prompts_per_step)
        )
        sampled = self.sampling.sample(self, step, alongside)
        rows, stage_stats = sampled.rows, sampled.stats

        # 4-5. reference and old log-probs of rows that only now are final
        if self.sampling.log_probs_after and rows.numel():
            explicit = rows if self.sampling.explicit_rows else None
            stage_stats += self._run(self._log_prob_stages(rows.numel() // n, explicit))

        # 6. advantages (driver-side consumer)
        t_adv = time.perf_counter()
        scores, advantage_metrics = self._advantages(rows)
        t_adv = time.perf_counter() - t_adv

        # 7. actor update: each DP rank trains on the rows planned for it, gradients summed over ranks
        plan, balance = self._update_plan(rows)
        with_old = self._need_old(rows.numel())
        behaviour = self.sampling.behaviour_ratio
        update = ActorWorker.update
        update_stats = self._run(
            [lambda: self.actors.call(update, self.dock, plan, with_old=with_old, behaviour=behaviour)]
        )
        version_metrics = self.sampling.updated(step + 1)

        # 8. metrics, samples, evaluation, clear
        stats = None
        if rows.numel():
            columns = ["accuracy", "response_length", *self.sampling.columns]
            stats = self.dock.get("grpo_metrics", columns, rows.numel(), indexes=rows, layout="packed",
                                  timeout=self.resources.stage_timeout_s)  # fmt: skip
        due = samples_due(step + 1, self.logging.samples_every)
        samples = self._samples(step + 1, rows) if due and rows.numel() else None
        audit_rows = self._audit_rows(rows, scores, stats) if self.audit is not None else {}
        dock_metrics = dock_step_metrics(self.dock.metrics(), self._dock_totals)
        self.sampling.clear(self.dock, rows)
        dock_metrics.update(self.sampling.after_clear(self.dock, step, stats))
        step_time = time.perf_counter() - t_start
        metrics: dict[str, Any] = {
            "step": step + 1,
            "data/prompts_drawn": self.data_position,  # which prompts the run has trained on so far
            "reward_mean": float(scores.mean()) if scores.numel() else 0.0,
            "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
            "time/advantages": t_adv,
            "time/step": step_time,
            **sampled.metrics,
            **version_metrics,
            **balance,
            **advantage_metrics,
            **dock_metrics,
        }
        if stats is not None:
            metrics["train_accuracy"] = float(stats.columns["accuracy"].mean())
            metrics["response_length"] = float(stats.columns["response_length"].float().mean())
            metrics["response_length_max"] = float(stats.columns["response_length"].max())
        metrics.update(merge_rank_metrics(stage_stats, update_stats))
        generated = metrics.get("rollout_tokens", metrics.get("async/rollout_tokens", 0.0))
        metrics["tokens_per_s"] = generated / step_time
        if (self.eval.every and (step + 1) % self.eval.every == 0) or step + 1 == self.max_steps:
            t_eval = time.perf_counter()
            metrics.update(self.wait([self.actors.call(ActorWorker.evaluate)])[0][0])
            metrics["time/eval"] = time.perf_counter() - t_eval
        if self.audit is not None:  # after the evaluation: divergence reads its held-out accuracy
            metrics.update(self.audit.observe(step + 1, metrics, **audit_rows))
        if samples is not None:
            metrics[SAMPLES_KEY] = samples
        trained = self.sampling.trained_prompts()
        if trained is not None:
            metrics[PROMPTS_KEY] = trained
        return metrics

    def _audit_rows(self, rows: torch.Tensor, scores: torch.Tensor, stats: Any) -> dict[str, Any]:
        """Per row: the reward, the accuracy verifier's verdict and the audit's format-only check (read
        from the dock without consuming; none for multi-turn trajectories, whose text holds tool turns)."""
        assert self.audit is not None
        if self.multiturn or stats is None:
            return {}
        batch = self.dock.peek(["responses", "answer"], rows, layout="packed")
        tok = self.setup.tokenizer
        texts = [tok.decode(p.tolist(), skip_special_tokens=True)
                 for p in batch.columns["responses"].split(batch.lengths["responses"].tolist())]  # fmt: skip
        answers = [tensor_text(p.to(torch.uint8))
                   for p in batch.columns["answer"].split(batch.lengths["answer"].tolist())]  # fmt: skip
        return {"reward": scores.tolist(), "correct": (stats.columns["accuracy"] >= 1).tolist(),
                "formatted": self.audit.formatted(texts, answers)}  # fmt: skip

    def _samples(self, step: int, rows: torch.Tensor) -> list[dict[str, Any]]:
        """Sample records of a few of `rows` (`run.samples`), read from the dock without consuming them.

        Reading and decoding draw no random numbers: the run trains as it would without samples.
        """
        picked = pick_rows(rows, self.rollout.n_samples_per_prompt, self.logging.samples_per_step)
        columns = ["prompts", "responses", "answer", "rm_scores", "accuracy", *self._judged]
        batch = self.dock.peek(columns + (["end_reason"] if self.multiturn else []), picked, layout="packed")
        tok = self.setup.tokenizer
        prompts: list[str] = []
        responses: list[str] = []
        answers: list[str] = []
        for name, out in (("prompts", prompts), ("responses", responses)):
            for part in batch.columns[name].split(batch.lengths[name].tolist()):
                out.append(tok.decode(part.tolist(), skip_special_tokens=True))
        for part in batch.columns["answer"].split(batch.lengths["answer"].tolist()):
            answers.append(tensor_text(part.to(torch.uint8)))
        records = build_samples(
            step, prompts, responses, answers, batch.columns["rm_scores"].tolist(),
            batch.columns["accuracy"].tolist(), {} if self.multiturn else self.reward.verifiers,
        )  # fmt: skip
        if self._judged:  # the judge's verdict, score and output of each row, as the reward stage put them
            add_judgements(records, batch, self.reward.judge.weight)
        if self.multiturn:  # why each trajectory ended (a failing environment shows here)
            for record, reason in zip(records, batch.columns["end_reason"].tolist(), strict=True):
                record["end"] = EndReason(int(reason)).label
        return records

    # -- running stages -------------------------------------------------------------------------

    def wait(self, pendings: Sequence[Pending[Any]]) -> list[list[Any]]:
        """Results of `pendings`, per call per rank (the stage timeout bounds the wait)."""
        return wait_all(pendings, self.resources.stage_timeout_s)

    def _run(self, starts: Sequence[Callable[[], Pending[dict[str, float]]]]) -> list[dict[str, float]]:
        """Start the stages in order: one after another (blocking) or all together; per-rank results."""
        if self.resources.blocking:
            waited = [self.wait([start()])[0] for start in starts]
        else:
            waited = self.wait([start() for start in starts])
        return [stats for per_rank in waited for stats in per_rank]

    def _share(self, num_groups: int, ranks: int) -> int:
        """Rows per rank and get: whole prompt groups, every group covered."""
        return -(-num_groups // ranks) * self.rollout.n_samples_per_prompt

    # -- 1-3: prompts, rollout, reward ----------------------------------------------------------

    def generate(
        self, count: int, version: int, also: Sequence[StageStart] = ()
    ) -> tuple[torch.Tensor, list[dict[str, float]]]:
        """Put `count` prompts, then roll them out by policy `version` and reward them (and run `also`
        in the same phase)."""
        rows = self._put_prompts(count)
        per_actor = self._share(count, len(self.actors.ranks))
        per_rewarder = self._share(count, len(self.rewards.ranks))
        stats = self._run([
            lambda: self.actors.call(ActorWorker.rollout, self.dock, per_actor, version=version),
            *self._reward_model_stage(count),
            lambda: self.rewards.call(RewardWorker.score, self.dock, per_rewarder),
            *also,
        ])  # fmt: skip
        return rows, stats

    def _put_prompts(self, count: int) -> torch.Tensor:
        """Draw `count` prompts from the data source and fan each out to its n rows; returns the rows."""
        samples = self.setup.source.batch(self._data_position, count)
        self._data_position += count
        prompts = [torch.tensor(encode_prompt(self.setup, s.prompt, self.max_prompt_tokens)) for s in samples]
        extra = prompt_extras(samples, with_prompt_text=self.multiturn or bool(self._judged))
        return self.dock.put_prompts(prompts, self.rollout.n_samples_per_prompt, extra=extra)

    def _reward_model_stage(self, count: int) -> list[StageStart]:
        """The reward models' stage over `count` prompt groups: on the actor ranks or their own workers."""
        if not self.reward.models:
            return []
        separate = self.cluster.reward_models
        if separate is not None:
            share = self._share(count, len(separate.ranks))
            return [lambda: separate.call(RewardModelWorker.reward_model_scores, self.dock, share)]
        share = self._share(count, self.actors.ranks[0].dp_size)  # one scorer per model replica
        return [lambda: self.actors.call(ActorWorker.reward_model_scores, self.dock, share)]

    # -- 4-5: log-probs -------------------------------------------------------------------------

    def _log_prob_stages(self, num_groups: int, rows: torch.Tensor | None = None) -> list[StageStart]:
        """Starters of the reference and old log-prob stages over `num_groups` prompt groups (exactly
        `rows`, when given: the actor ranks read them; separate reference workers share rows)."""
        count = self._share(num_groups, self.actors.ranks[0].dp_size)  # one reader per model replica
        mine = None if rows is None else rows.tolist()
        starts: list[StageStart] = []
        references = self.cluster.references
        if self.algorithm.kl_coef > 0 and references is not None:  # separate reference workers share rows
            ref_count = self._share(num_groups, len(references.ranks))
            starts.append(lambda: references.call(ReferenceWorker.reference_logprobs, self.dock, ref_count))
        elif self.algorithm.kl_coef > 0:
            starts.append(lambda: self.actors.call(ActorWorker.reference_logprobs, self.dock, count, mine))
        if self._need_old(num_groups * self.rollout.n_samples_per_prompt):
            starts.append(lambda: self.actors.call(ActorWorker.old_logprobs, self.dock, count, mine))
        if self.algorithm.distill.enabled:  # teacher and student log-probs at the rollout's temperature
            starts.append(lambda: self.actors.call(ActorWorker.teacher_logprobs, self.dock, count, mine))
        return starts

    def _need_old(self, num_rows: int) -> bool:
        """Old log-probs are needed unless the update takes exactly one optimiser step (or KL is a reward).

        With a rollout engine of its own kernels (vLLM) they are needed every step: they are what its
        log-probs are compared with (`rollout/logp_mismatch_*`). Where the ratio divides by the
        behaviour log-probs (partial rollout) only a KL in the reward needs them. With an off-policy
        correction they are the proximal policy, which for one optimiser step is the current one.
        """
        algo = self.algorithm
        kl_in_reward = algo.kl_in_reward and algo.kl_coef > 0
        single_step = algo.epochs == 1 and num_rows <= self._mini_batch
        if self.correction.active:  # the proximal policy: the update's start (current, one step)
            return not single_step or kl_in_reward or self.separate_kernels
        if self.sampling.behaviour_ratio:
            return kl_in_reward
        return not single_step or kl_in_reward or self.separate_kernels

    @property
    def _mini_batch(self) -> int:
        return self.algorithm.mini_batch_size or self.rollout.batch_size

    # -- 6-7: advantages and the update's plan --------------------------------------------------

    def _advantages(self, rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Advantages of `rows` (`algorithm.advantage`, on model tokens) into the dock; scores, metrics."""
        algo = self.algorithm
        if rows.numel() == 0:
            return torch.zeros(0), {}
        kl_in_reward = algo.kl_in_reward and algo.kl_coef > 0
        columns = [
            "rm_scores",
            "response_length",
            *(["ref_log_prob", "old_log_prob"] if kl_in_reward else []),
            *(["model_mask"] if self.multiturn else []),
            *(DISTILL_COLUMNS if algo.distill.enabled else []),
        ]
        batch = self.dock.get("compute_advantage", columns, rows.numel(), indexes=rows, layout="packed",
                              timeout=self.resources.stage_timeout_s)  # fmt: skip
        assert batch is not None  # explicit rows are never "all consumed"
        scores = batch.columns["rm_scores"].float()  # [B], group after group
        rewards, metrics = scores, {}
        lengths = batch.columns["response_length"]  # [B]
        model_tokens = row_sums(batch.columns["model_mask"].long(), lengths) if self.multiturn else lengths
        if kl_in_reward:
            old, ref = batch.columns["old_log_prob"], batch.columns["ref_log_prob"]
            if self.multiturn:  # no KL at the environment's tokens
                ref = torch.where(batch.columns["model_mask"].bool(), ref, old)
            kl = sequence_kl(old, ref, lengths, algo.kl_kind)  # [B]
            rewards = scores - algo.kl_coef * kl
            metrics["reward/kl_penalty"] = float((algo.kl_coef * kl).mean())
        advantages = self.estimator(rewards, self.rollout.n_samples_per_prompt, model_tokens)  # [B]
        self.dock.put({"advantages": advantages}, batch.indexes)
        if algo.distill.enabled:  # one advantage per token from the teacher (`workers._teacher`)
            tokens, distilled = distill_advantages(batch, advantages, algo.distill, self.multiturn)
            self.dock.put({TOKEN_ADVANTAGES: tokens}, batch.indexes)
            metrics.update(distilled)
        return scores, metrics

    def _update_plan(self, rows: torch.Tensor) -> tuple[list[list[list[int]]], dict[str, float]]:
        """Per DP rank, the dock rows of each mini-batch; and the token imbalance across ranks.

        Mini-batches are consecutive runs of whole groups; inside each, `batching.dp_balance` spreads
        the groups over ranks with even token totals (else contiguous shares).
        """
        n, world, mini = self.rollout.n_samples_per_prompt, self.actors.ranks[0].dp_size, self._mini_batch
        plan: list[list[list[int]]] = [[] for _ in range(world)]
        if rows.numel() == 0:
            return [[[]] for _ in range(world)], {}
        if world == 1:  # one rank takes every row: no lengths to read from the dock
            return [[rows[start : start + mini].tolist() for start in range(0, rows.numel(), mini)]], {}
        lengths = self._lengths(rows)
        rank_tokens = [0] * world
        for start in range(0, rows.numel(), mini):
            part = rows[start : start + mini]
            part_lengths = lengths[start : start + mini].tolist()
            shares = self._split_groups(part_lengths, world, n)
            for rank, share in enumerate(shares):
                plan[rank].append([int(part[i]) for i in share])
                rank_tokens[rank] += sum(part_lengths[i] for i in share)
        mean = sum(rank_tokens) / world
        return plan, {"dp/token_imbalance": max(rank_tokens) / mean - 1 if mean else 0.0}

    def _split_groups(self, lengths: list[int], world: int, n: int) -> list[list[int]]:
        if self.batching.dp_balance:
            from entrepot.batching import balance_across_ranks

            return balance_across_ranks(lengths, world, group_size=n, equal_count=True).ranks
        groups = len(lengths) // n
        per = -(-groups // world)
        return [list(range(r * per * n, min((r + 1) * per, groups) * n)) for r in range(world)]

    def _lengths(self, rows: torch.Tensor) -> torch.Tensor:
        """Prompt + response tokens of each of `rows`."""
        batch = self.dock.peek(["prompt_length", "response_length"], rows)
        return batch.columns["prompt_length"] + batch.columns["response_length"]
