"""The GRPO fit loop of the full system: the dock, an actor worker group and a reward worker group.

One iteration, every stage a dock consumer (`train_step` reads in this order):

    put prompts (n samples each) -> rollout (actor in infer mode) -> [reward models] -> rule reward
    [dynamic sampling: drop zero-variance groups, put new prompts, rollout + reward again, up to
     algorithm.max_resample_rounds rounds]
    -> reference log-probs -> old log-probs (skipped when provably equal to the current ones:
    one epoch, one mini-batch) -> group advantages (here, in the driver) -> actor update (each DP
    rank the rows planned for it) -> metrics -> clear

With partial rollout (`rollout.partial_max_tokens`) the rollout gives every unfinished response one
round of new tokens (new prompts and those carried over, under policy version = steps trained), and
the step goes on with the groups that finished (`dock.finished_rows()`); the rest stay in the dock.

The trainer calls typed methods on worker groups (`entrepot.grpo.workers`); whether the workers are
Ray actors or objects in this process is decided once, in `launch`. The reference and reward-model
stages run on the actor ranks (`resources.colocate`) or on their own groups. With `resources.blocking`
each stage waits for the previous one; without it the stages of a phase start together and wait in
the dock for their inputs, and the first failure fails the step (`StageError`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from entrepot.dock import DockStateError
from entrepot.grpo.algo.losses import group_advantages, keep_varied_groups, sequence_kl
from entrepot.grpo.config import GRPOConfig, config_to_dict
from entrepot.grpo.data.sources import build_task, encode_prompt
from entrepot.grpo.embedded.threads import configure_threads
from entrepot.grpo.errors import CheckpointError
from entrepot.grpo.run import checkpoint as ckpt
from entrepot.grpo.run.metrics import MetricsWriter, dock_step_metrics, merge_rank_metrics
from entrepot.grpo.workers import (
    ActorWorker,
    Pending,
    ReferenceWorker,
    RewardModelWorker,
    RewardWorker,
    launch,
    text_tensor,
    wait_all,
)
from entrepot.grpo.workers.group import RankInfo

__all__ = ["Trainer"]


class Trainer:
    """Builds the dock and the workers for `config` and runs GRPO steps, writing into `run_dir`.

    Args:
        config: the run configuration.
        run_dir: where metrics.jsonl, config.yaml and checkpoints go (created if missing).
        resume: continue from the newest checkpoint in `run_dir`.
        on_startup: called with a line for each start-up phase as it begins (a display shows them).
        started_at: `time.perf_counter()` when the caller's part of start-up began (starting Ray,
            importing this module); None: start-up begins here.

    Start-up (workers started, models built, checkpoint restored) is timed on its own: the first
    step of a session reports it as ``time/startup`` and its ``time/step`` excludes it.
    """

    def __init__(
        self, config: GRPOConfig, run_dir: str | Path, *, resume: bool = False,
        on_startup: Callable[[str], None] | None = None, started_at: float | None = None,
    ) -> None:  # fmt: skip
        here = time.perf_counter()
        started = here if started_at is None else started_at
        say = on_startup or (lambda line: None)
        self.config = config
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        configure_threads(config.threads)
        where = "on Ray" if config.uses_ray() else "in this process"
        ranks = config.resources.num_actor_workers * config.parallel.train.model_parallel
        say(f"starting {ranks} actor rank(s) + {_other_workers(config)} {where}")
        self.cluster = launch(config, str(self.run_dir))  # Ray (when used) and the dock; workers start
        placement = self.cluster.placement()
        if placement is not None:  # on a cluster: which node each replica got (an error names it too)
            say(placement)
        launched = time.perf_counter()
        self.dock = self.cluster.dock
        self.actors, self.rewards = self.cluster.actors, self.cluster.rewards
        self.setup = build_task(config, self._tokenizer())
        self.step = 0
        self.data_position = 0  # prompts drawn so far (dynamic sampling draws more than one batch a step)
        self.history: list[dict[str, Any]] = []  # this session's steps (kept when interrupted)
        self.metrics = MetricsWriter(self.run_dir, config.logging)
        self._dock_totals: dict[str, float] = {}
        try:
            self._wait([
                self.actors.call(ActorWorker.ready), self.rewards.call(RewardWorker.ready),
                *([self.cluster.references.call(ReferenceWorker.ready)] if self.cluster.references else []),
                *([self.cluster.reward_models.call(RewardModelWorker.ready)]
                  if self.cluster.reward_models else []),
            ])  # fmt: skip
            ready = time.perf_counter()
            if resume:
                say("restoring the newest checkpoint")
                self._resume(say)
        except BaseException:
            self.close()  # a worker that failed to start (or a bad checkpoint) leaves no workers behind
            raise
        self.startup_s = time.perf_counter() - started
        what = "Ray and imports" if config.uses_ray() else "imports"
        before = f"{what} {here - started:.1f} s, " if here - started >= 0.05 else ""
        if config.uses_ray():  # workers start in their own processes while Ray hands them over
            phases = f"{before}dock {launched - here:.1f} s, workers ready {ready - launched:.1f} s"
        else:
            phases = f"{before}dock and workers built {ready - here:.1f} s"
        say(f"started in {self.startup_s:.1f} s ({phases})")

    def _tokenizer(self) -> Any:
        if self.config.model.path is None:
            return None
        from entrepot.grpo.engines.models import load_tokenizer

        return load_tokenizer(self.config.model.path)

    # -- running stages -------------------------------------------------------------------------

    def _wait(self, pendings: Sequence[Pending[Any]]) -> list[list[Any]]:
        return wait_all(pendings, self.config.resources.stage_timeout_s)

    def _run(self, starts: Sequence[Callable[[], Pending[dict[str, float]]]]) -> list[dict[str, float]]:
        """Start the stages in order: one after another (blocking) or all together; per-rank results."""
        if self.config.resources.blocking:
            waited = [self._wait([start()])[0] for start in starts]
        else:
            waited = self._wait([start() for start in starts])
        return [stats for per_rank in waited for stats in per_rank]

    def _share(self, num_groups: int, ranks: int) -> int:
        """Rows per rank and get: whole prompt groups, every group covered."""
        return -(-num_groups // ranks) * self.config.rollout.n_samples_per_prompt

    # -- the loop -------------------------------------------------------------------------------

    def fit(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Run steps until `max_steps` (or the target accuracy); checkpoint on Ctrl-C and re-raise.

        A failed step (`StageError`, a timeout) propagates without a checkpoint: the run directory
        keeps its last good one, and `--resume` continues from there. So does a Ctrl-C that lands in
        the middle of a step (a second Ctrl-C): a half-done step is never checkpointed.
        """
        history = self.history
        at_boundary = True
        try:
            while self.step < self.config.max_steps:
                at_boundary = False
                metrics = self.train_step()
                at_boundary = True
                history.append(metrics)
                self.metrics.write(metrics)
                if on_step is not None:
                    on_step(metrics)
                every = self.config.checkpoint.save_every
                if every and self.step % every == 0 and self.step < self.config.max_steps:
                    self.save()
                target = self.config.eval.target_accuracy
                if target is not None and metrics.get("accuracy", 0.0) >= target:
                    break
        except KeyboardInterrupt:
            if at_boundary:
                self.save()
            raise
        self.save()
        return history

    def train_step(self) -> dict[str, Any]:
        """One GRPO iteration through the dock; returns the step's metrics."""
        cfg = self.config
        algo = cfg.algorithm
        t_start = time.perf_counter()

        # 1-3. prompts -> rollout -> reward; dynamic sampling refills dropped groups.
        #      Without dynamic sampling the log-prob stages start in the same phase (they wait in
        #      the dock for responses, overlapping the reward workers when blocking is off).
        mini = algo.mini_batch_size or cfg.rollout.batch_size
        log_prob_stages = [] if algo.dynamic_sampling else self._log_prob_stages(cfg.rollout.prompts_per_step)
        rows, stage_stats, sampling = self._sample(log_prob_stages)

        # 4-5. reference and old log-probs of the kept rows (dynamic sampling: only now they are final)
        if algo.dynamic_sampling and rows.numel():
            stage_stats += self._run(self._log_prob_stages(rows.numel() // cfg.rollout.n_samples_per_prompt))

        # 6. group advantages (driver-side consumer)
        t_adv = time.perf_counter()
        scores, advantage_metrics = self._advantages(rows)
        t_adv = time.perf_counter() - t_adv

        # 7. actor update: each DP rank trains on the rows planned for it, gradients summed over ranks
        plan, balance = self._update_plan(rows, mini)
        with_old = self._need_old(rows.numel())
        update_stats = self._run(
            [lambda: self.actors.call(ActorWorker.update, self.dock, plan, with_old=with_old)]
        )

        # 8. metrics, evaluation, clear
        stats = None
        partial = cfg.rollout.partial_max_tokens is not None
        if rows.numel():
            columns = ["accuracy", "response_length", *(["policy_version"] if partial else [])]
            stats = self.dock.get("grpo_metrics", columns, rows.numel(), indexes=rows, layout="packed",
                                  timeout=cfg.resources.stage_timeout_s)  # fmt: skip
        dock_metrics = dock_step_metrics(self.dock.metrics(), self._dock_totals)
        self.dock.clear()
        if partial:
            dock_metrics.update(self._partial_metrics(stats))
        self.step += 1
        step_time = time.perf_counter() - t_start
        metrics: dict[str, Any] = {
            "step": self.step,
            "data/prompts_drawn": self.data_position,  # which prompts the run has trained on so far
            "reward_mean": float(scores.mean()) if scores.numel() else 0.0,
            "reward_std": float(scores.std()) if scores.numel() > 1 else 0.0,
            "time/advantages": t_adv,
            "time/step": step_time,
            **sampling,
            **balance,
            **advantage_metrics,
            **dock_metrics,
        }
        if stats is not None:
            metrics["train_accuracy"] = float(stats.columns["accuracy"].mean())
            metrics["response_length"] = float(stats.columns["response_length"].float().mean())
            metrics["response_length_max"] = float(stats.columns["response_length"].max())
        metrics.update(merge_rank_metrics(stage_stats, update_stats))
        metrics["tokens_per_s"] = metrics.get("rollout_tokens", 0.0) / step_time
        if not self.history:  # this session's first step: its start-up, timed apart from the step
            metrics["time/startup"] = self.startup_s
        if (cfg.eval.every and self.step % cfg.eval.every == 0) or self.step == cfg.max_steps:
            t_eval = time.perf_counter()
            metrics.update(self._wait([self.actors.call(ActorWorker.evaluate)])[0][0])
            metrics["time/eval"] = time.perf_counter() - t_eval
        return metrics

    def _partial_metrics(self, stats: Any) -> dict[str, float]:
        """Tokens trained this step per policy-version age (steps behind the policy they train), and
        the groups still in flight after the step's clear."""
        in_flight = self.dock.progress("actor_rollout")["live"] // self.config.rollout.n_samples_per_prompt
        out = {"partial/groups_in_flight": float(in_flight)}
        if stats is not None:
            ages = self.step - stats.columns["policy_version"].long()  # [T] every trained token
            for age, tokens in enumerate(torch.bincount(ages).tolist()):
                out[f"partial/tokens_age_{age}"] = float(tokens)
        return out

    def _log_prob_stages(self, num_groups: int) -> list[Callable[[], Pending[dict[str, float]]]]:
        """Starters of the reference and old log-prob stages over `num_groups` prompt groups."""
        algo = self.config.algorithm
        count = self._share(num_groups, self.actors.ranks[0].dp_size)  # one reader per model replica
        starts: list[Callable[[], Pending[dict[str, float]]]] = []
        references = self.cluster.references
        if algo.kl_coef > 0 and references is not None:  # separate reference workers share the rows
            ref_count = self._share(num_groups, len(references.ranks))
            starts.append(lambda: references.call(ReferenceWorker.reference_logprobs, self.dock, ref_count))
        elif algo.kl_coef > 0:
            starts.append(lambda: self.actors.call(ActorWorker.reference_logprobs, self.dock, count))
        if self._need_old(num_groups * self.config.rollout.n_samples_per_prompt):
            starts.append(lambda: self.actors.call(ActorWorker.old_logprobs, self.dock, count))
        return starts

    def _need_old(self, num_rows: int) -> bool:
        """Old log-probs are needed unless the update takes exactly one optimiser step (or KL is a reward).

        With vLLM rollouts they are needed every step: they are what vLLM's log-probs are compared with
        (`rollout/logp_mismatch_*`).
        """
        algo = self.config.algorithm
        mini = algo.mini_batch_size or self.config.rollout.batch_size
        single_step = algo.epochs == 1 and num_rows <= mini
        vllm = self.config.engine.rollout == "vllm"
        kl_in_reward = algo.kl_in_reward and algo.kl_coef > 0
        if self.config.rollout.partial_max_tokens is not None:  # the ratio divides by the behaviour log-probs
            return kl_in_reward
        return not single_step or kl_in_reward or vllm

    # -- sampling (with dynamic sampling's drop and refill) --------------------------------------

    def _put_prompts(self, count: int) -> torch.Tensor:
        """Draw `count` prompts from the data source and fan each out to its n rows; returns the rows."""
        cfg = self.config
        samples = self.setup.source.batch(self.data_position, count)
        self.data_position += count
        prompts = [
            torch.tensor(encode_prompt(self.setup, s.prompt, cfg.data.max_prompt_tokens)) for s in samples
        ]
        return self.dock.put_prompts(prompts, cfg.rollout.n_samples_per_prompt,
                                     extra={"answer": [text_tensor(s.answer) for s in samples]})  # fmt: skip

    def _generate(
        self, count: int, also: Sequence[Callable[[], Pending[dict[str, float]]]] = ()
    ) -> tuple[torch.Tensor, list[dict[str, float]]]:
        """Put `count` prompts, then rollout and reward them (and run `also` in the same phase)."""
        rows = self._put_prompts(count)
        per_actor = self._share(count, len(self.actors.ranks))
        per_rewarder = self._share(count, len(self.rewards.ranks))
        stats = self._run([
            lambda: self.actors.call(ActorWorker.rollout, self.dock, per_actor, version=self.step),
            *self._reward_model_stage(count),
            lambda: self.rewards.call(RewardWorker.score, self.dock, per_rewarder),
            *also,
        ])  # fmt: skip
        return rows, stats

    def _reward_model_stage(self, count: int) -> list[Callable[[], Pending[dict[str, float]]]]:
        """The reward models' stage over `count` prompt groups: on the actor ranks or their own workers."""
        if not self.config.reward.models:
            return []
        separate = self.cluster.reward_models
        if separate is not None:
            share = self._share(count, len(separate.ranks))
            return [lambda: separate.call(RewardModelWorker.reward_model_scores, self.dock, share)]
        share = self._share(count, self.actors.ranks[0].dp_size)  # one scorer per model replica
        return [lambda: self.actors.call(ActorWorker.reward_model_scores, self.dock, share)]

    def _sample(
        self, also: Sequence[Callable[[], Pending[dict[str, float]]]]
    ) -> tuple[torch.Tensor, list[dict[str, float]], dict[str, float]]:
        """Rows of this step (whole groups, group after group), stage stats and sampling metrics."""
        cfg = self.config
        n, wanted = cfg.rollout.n_samples_per_prompt, cfg.rollout.prompts_per_step
        if cfg.rollout.partial_max_tokens is not None:
            return self._partial_sample(also)
        rows, stats = self._generate(wanted, also)
        if not cfg.algorithm.dynamic_sampling:
            return rows, stats, {}
        kept, dropped, rounds = self._drop_uniform_groups(rows), 0, 0
        dropped += (rows.numel() - kept.numel()) // n
        while kept.numel() < wanted * n and rounds < cfg.algorithm.max_resample_rounds:
            rounds += 1
            new_rows, more = self._generate(wanted - kept.numel() // n)
            stats += more
            new_kept = self._drop_uniform_groups(new_rows)
            dropped += (new_rows.numel() - new_kept.numel()) // n
            kept = torch.cat([kept, new_kept])
        return (
            kept,
            stats,
            {
                "sampling/groups_dropped": float(dropped),
                "sampling/rounds": float(rounds),
                "sampling/groups_kept": float(kept.numel() // n),
            },
        )

    def _partial_sample(
        self, also: Sequence[Callable[[], Pending[dict[str, float]]]]
    ) -> tuple[torch.Tensor, list[dict[str, float]], dict[str, float]]:
        """Partial rollout: new prompts join the responses carried over, everything gets one round by
        this step's policy (version = steps trained), and the step takes the groups that finished."""
        n = self.config.rollout.n_samples_per_prompt
        stale = self.dock.set_policy_version(self.step)  # drops groups that would exceed max_staleness
        _, stats = self._generate(self.config.rollout.prompts_per_step, also)
        rows = self.dock.finished_rows()
        return rows, stats, {"partial/groups_finished": float(rows.numel() // n),
                             "partial/groups_dropped_stale": float(stale // n)}  # fmt: skip

    def _drop_uniform_groups(self, rows: torch.Tensor) -> torch.Tensor:
        """Clear the groups of `rows` whose rewards all agree from the dock; return the kept rows."""
        n = self.config.rollout.n_samples_per_prompt
        scores = self.dock.peek(["rm_scores"], rows).columns["rm_scores"]
        keep = keep_varied_groups(scores, n)
        if not bool(keep.all()):
            self.dock.clear(rows[~keep])
        return rows[keep]

    # -- driver-side stages ---------------------------------------------------------------------

    def _advantages(self, rows: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Group-normalised advantages of `rows` (one per response) into the dock; the scores and metrics."""
        algo = self.config.algorithm
        if rows.numel() == 0:
            return torch.zeros(0), {}
        kl_in_reward = algo.kl_in_reward and algo.kl_coef > 0
        columns = [
            "rm_scores",
            "response_length",
            *(["ref_log_prob", "old_log_prob"] if kl_in_reward else []),
        ]
        batch = self.dock.get("compute_advantage", columns, rows.numel(), indexes=rows, layout="packed",
                              timeout=self.config.resources.stage_timeout_s)  # fmt: skip
        assert batch is not None  # explicit rows are never "all consumed"
        scores = batch.columns["rm_scores"].float()  # [B], group after group
        rewards, metrics = scores, {}
        if kl_in_reward:
            lengths = batch.columns["response_length"]
            old, ref = batch.columns["old_log_prob"], batch.columns["ref_log_prob"]
            kl = sequence_kl(old, ref, lengths, algo.kl_kind)
            rewards = scores - algo.kl_coef * kl
            metrics["reward/kl_penalty"] = float((algo.kl_coef * kl).mean())
        n = self.config.rollout.n_samples_per_prompt
        advantages = group_advantages(rewards, n, normalize_std=algo.normalize_std)
        self.dock.put({"advantages": advantages}, batch.indexes)
        return scores, metrics

    def _update_plan(self, rows: torch.Tensor, mini: int) -> tuple[list[list[list[int]]], dict[str, float]]:
        """Per DP rank, the dock rows of each mini-batch; and the token imbalance across ranks.

        Mini-batches are consecutive runs of whole groups; inside each, `batching.dp_balance` spreads
        the groups over ranks with even token totals (else contiguous shares).
        """
        cfg = self.config
        n, world = cfg.rollout.n_samples_per_prompt, self.actors.ranks[0].dp_size
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
        if self.config.batching.dp_balance:
            from entrepot.batching import balance_across_ranks

            return balance_across_ranks(lengths, world, group_size=n, equal_count=True).ranks
        groups = len(lengths) // n
        per = -(-groups // world)
        return [list(range(r * per * n, min((r + 1) * per, groups) * n)) for r in range(world)]

    def _lengths(self, rows: torch.Tensor) -> torch.Tensor:
        """Prompt + response tokens of each of `rows`."""
        batch = self.dock.peek(["prompt_length", "response_length"], rows)
        return batch.columns["prompt_length"] + batch.columns["response_length"]

    # -- checkpoints ----------------------------------------------------------------------------

    def save(self) -> Path:
        """Write a checkpoint of the current step (the dock and a megatron HF export inside it) and prune."""
        states = self._wait([self.actors.call(ActorWorker.state)])[0]
        directory = self.run_dir / "checkpoints" / f"step_{self.step:06d}"
        meta = {"step": self.step, "data_position": self.data_position, "config": config_to_dict(self.config)}
        writers = [lambda tmp: self.dock.save(str((tmp / "dock.pt").resolve()))]  # a Ray dock: absolute
        if self.config.engine.train == "megatron":  # sharded weights: also an HF directory, whole
            writers.append(lambda tmp: self._wait([self.actors.call(ActorWorker.export_hf, str(tmp / "hf"))]))
        ckpt.write_checkpoint(directory, states, meta, writers,
                              shards=[_shard(rank) for rank in self.actors.ranks])  # fmt: skip
        ckpt.prune(self.run_dir, self.config.checkpoint.keep_last)
        return directory

    def _resume(self, say: Callable[[str], None]) -> None:
        """Restore the newest complete checkpoint, every file verified against its manifest first."""
        directory = ckpt.latest_checkpoint(self.run_dir)
        if directory is None:
            raise CheckpointError(ckpt.nothing_to_resume(self.run_dir))
        newer = [p.name for p in ckpt.incomplete_checkpoints(self.run_dir) if p.name > directory.name]
        if newer:
            say(f"skipping {', '.join(newer)} (no manifest.json: a save that was stopped)")
        manifest = ckpt.verify_checkpoint(directory)
        states = []
        meta: dict[str, Any] = {}
        for rank in self.actors.ranks:
            state, meta = ckpt.read_checkpoint(directory, rank.rank, _shard(rank), verified=manifest)
            states.append(state)
        self._wait([self.actors.call(ActorWorker.load_state, states)])
        if "dock.pt" in manifest.files:
            try:
                self.dock.load(str((directory / "dock.pt").resolve()))  # a Ray dock resolves from its run dir
            except DockStateError as error:
                raise CheckpointError(f"checkpoint {str(directory)!r}: dock.pt: {error}") from error
        self.step = int(meta["step"])
        self.data_position = int(meta["data_position"])
        self.metrics.truncate(self.step)  # steps after the checkpoint run again
        (self.run_dir / "resumed_from.json").write_text(
            json.dumps({"checkpoint": str(directory), "step": self.step})
        )

    # -- inspection (tests, benchmarks) ---------------------------------------------------------

    def parameters(self, rank: int = 0) -> dict[str, torch.Tensor]:
        """A copy of rank `rank`'s trainable parameters."""
        return dict(self._wait([self.actors.call(ActorWorker.parameters_digest)])[0][rank])

    def gradients(self, rank: int = 0) -> dict[str, torch.Tensor]:
        """A copy of rank `rank`'s gradients of the last optimiser step (after clipping)."""
        return dict(self._wait([self.actors.call(ActorWorker.gradients_digest)])[0][rank])

    def close(self) -> None:
        """Stop the workers (the Ray runtime itself stays up for the next run in this process)."""
        self.metrics.close()
        self.cluster.close()


def _other_workers(config: GRPOConfig) -> str:
    """The start-up line's count of the non-actor workers."""
    resources = config.resources
    parts = [f"{resources.num_reward_workers} reward worker(s)"]
    if not resources.colocate and config.algorithm.kl_coef > 0:
        parts.append(f"{resources.reference_workers} reference worker(s)")
    if not resources.colocate and config.reward.models:
        parts.append(f"{resources.reward_model_workers} reward-model worker(s)")
    return " + ".join(parts)


def _shard(rank: RankInfo) -> int:
    """The model-parallel shard a rank holds (its TP x PP position; DP replicas share it)."""
    return rank.pp_rank * rank.tp_size + rank.tp_rank
