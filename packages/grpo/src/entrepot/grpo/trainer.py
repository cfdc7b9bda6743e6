"""The GRPO fit loop of the full system: dock, co-located actor workers and reward workers on Ray.

One iteration, every stage a dock consumer (the loop below reads in this order):

    put prompts (n samples each) -> rollout (actor in infer mode) -> rule reward
    -> reference log-probs -> old log-probs (skipped when provably equal to the current ones:
    one epoch, one mini-batch) -> group advantages -> actor update (train mode) -> metrics -> clear

Workers run as Ray actors (``resources.use_ray``) or, with the same code, in this process.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from entrepot.grpo import checkpoint as ckpt
from entrepot.grpo.config import GRPOConfig, config_to_dict
from entrepot.grpo.data import build_task, encode_prompt
from entrepot.grpo.metrics import MetricsWriter, merge_rank_metrics
from entrepot.grpo.stages import shaped_advantages
from entrepot.grpo.threads import configure_threads, worker_env
from entrepot.grpo.workers import ActorWorker, RewardWorker, column_rows, text_tensor

__all__ = ["Trainer"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Trainer:
    """Builds the dock and the workers for `config` and runs GRPO steps, writing into `run_dir`.

    Args:
        config: the run configuration.
        run_dir: where metrics.jsonl, config.yaml and checkpoints go (created if missing).
        resume: continue from the newest checkpoint in `run_dir`.
    """

    def __init__(self, config: GRPOConfig, run_dir: str | Path, *, resume: bool = False) -> None:
        from entrepot.dock import GRPODock

        self.config = config
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        configure_threads(config.threads)
        cfg_dict = config_to_dict(config)
        world = config.resources.num_actor_workers
        dock_args: dict[str, Any] = {
            "prompts_num": config.rollout.prompts_per_step,
            "n_samples_per_prompt": config.rollout.n_samples_per_prompt,
            "extra_columns": ("answer", "accuracy"),
            "seed": config.seed,
        }
        dist_init = f"tcp://127.0.0.1:{_free_port()}" if world > 1 else ""
        if config.resources.use_ray:
            import ray

            if not ray.is_initialized():
                ray.init(
                    address=config.resources.ray_address,
                    runtime_env={"env_vars": worker_env(config.threads)},
                    include_dashboard=False,
                    logging_level="ERROR",
                    log_to_driver=False,
                )
            from entrepot.dock.ray import RayDockClient

            # env_vars reach the worker before it imports torch (OMP_WAIT_POLICY is read at load time)
            opts = {
                "num_cpus": config.resources.num_cpus_per_worker,
                "runtime_env": {"env_vars": worker_env(config.threads)},
            }
            self.dock: Any = RayDockClient.launch(GRPODock, num_cpus=0, **dock_args)
            self.actors = [
                ray.remote(ActorWorker).options(**opts).remote(cfg_dict, rank, world, dist_init)
                for rank in range(world)
            ]
            self.rewarders = [
                ray.remote(RewardWorker).options(**opts).remote(cfg_dict)
                for _ in range(config.resources.num_reward_workers)
            ]
        else:
            self.dock = GRPODock(**dock_args)
            self.actors = [ActorWorker(cfg_dict)]
            self.rewarders = [RewardWorker(cfg_dict)]
        self.setup = build_task(config, self._tokenizer())
        self.step = 0
        self.history: list[dict[str, Any]] = []  # this session's steps (kept when interrupted)
        self.metrics = MetricsWriter(self.run_dir, config.logging)
        if resume:
            self._resume()

    def _tokenizer(self) -> Any:
        if self.config.model.path is None:
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.config.model.path, local_files_only=True)

    # -- calling workers --------------------------------------------------------------------------

    def _submit(self, workers: Sequence[Any], method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start `method` on every worker: Ray futures, or (in-process) the results themselves."""
        if not self.config.resources.use_ray:
            return [getattr(w, method)(*args, **kwargs) for w in workers]
        return [getattr(w, method).remote(*args, **kwargs) for w in workers]

    def _resolve(self, handles: Sequence[Any]) -> list[Any]:
        """Results of `_submit` (waits for Ray futures)."""
        if not self.config.resources.use_ray:
            return list(handles)
        import ray

        return [ray.get(h) if isinstance(h, ray.ObjectRef) else h for h in handles]

    def _all(self, workers: Sequence[Any], method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call `method` on every worker (concurrently on Ray) and wait for the results."""
        return self._resolve(self._submit(workers, method, *args, **kwargs))

    # -- the loop -------------------------------------------------------------------------------

    def fit(self, on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
        """Run steps until `max_steps` (or the target accuracy); checkpoint on Ctrl-C and re-raise."""
        history = self.history
        try:
            while self.step < self.config.max_steps:
                metrics = self.train_step()
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
            self.save()
            raise
        self.save()
        return history

    def train_step(self) -> dict[str, Any]:
        """One GRPO iteration through the dock; returns the step's metrics."""
        cfg = self.config
        algo, rollout = cfg.algorithm, cfg.rollout
        n, batch_size = rollout.n_samples_per_prompt, rollout.batch_size
        per_actor = batch_size // len(self.actors)
        per_rewarder = batch_size // len(self.rewarders)
        t_start = time.perf_counter()

        # 1. prompts: n rows per prompt, answers travel as UTF-8 bytes for the reward workers
        samples = self.setup.source.batch(self.step * rollout.prompts_per_step, rollout.prompts_per_step)
        prompts = [
            torch.tensor(encode_prompt(self.setup, s.prompt, cfg.data.max_prompt_tokens)) for s in samples
        ]
        self.dock.put_prompts(prompts, n, extra={"answer": [text_tensor(s.answer) for s in samples]})

        # With resources.blocking=false the stages are only started here; each one waits in the
        # dock for its input columns, so the reward workers score while the actor computes the
        # reference log-probs. Actor calls run in submission order on each actor.
        run = self._all if cfg.resources.blocking else self._submit

        # 2. rollout: each actor rank reshards train -> infer and generates its share
        rollout_stats = run(self.actors, "rollout", self.dock, per_actor)

        # 3. rule reward
        reward_stats = run(self.rewarders, "score", self.dock, per_rewarder)

        # 4. reference log-probs (the reference shares the actor's device: full co-location)
        ref_stats = run(self.actors, "reference_logprobs", self.dock, per_actor) if algo.kl_coef > 0 else []

        # 5. old log-probs, only when the update takes more than one optimiser step (or KL goes in the reward)
        single_step = algo.epochs == 1 and (algo.mini_batch_size in (None, batch_size))
        need_old = not single_step or (algo.kl_in_reward and algo.kl_coef > 0)
        old_stats = run(self.actors, "old_logprobs", self.dock, per_actor) if need_old else []

        # 6. group advantages (driver-side consumer)
        t_adv = time.perf_counter()
        scores = self._advantages()
        t_adv = time.perf_counter() - t_adv

        # 7. actor update: DP ranks take their shares, gradients are averaged
        shares = self._dp_balanced_rows()
        if shares is None:
            update_stats = run(self.actors, "update", self.dock, per_actor, with_old=need_old)
        else:
            # Start every rank before waiting on any: ranks meet in the gradient all-reduce.
            update_stats = [
                self._submit([actor], "update", self.dock, per_actor, with_old=need_old, indexes=rows)[0]
                for actor, rows in zip(self.actors, shares, strict=True)
            ]
        stage_stats = self._resolve([*rollout_stats, *reward_stats, *ref_stats, *old_stats])
        update_stats = self._resolve(update_stats)

        # 8. metrics, evaluation, clear
        stats = self.dock.get("grpo_metrics", ["rm_scores", "accuracy", "response_length"], batch_size)
        self.dock.clear()
        self.step += 1
        step_time = time.perf_counter() - t_start
        metrics: dict[str, Any] = {
            "step": self.step,
            "reward_mean": float(scores.mean()),
            "reward_std": float(scores.std()),
            "train_accuracy": float(stats.data["accuracy"].mean()),
            "response_length": float(stats.data["response_length"].float().mean()),
            "response_length_max": float(stats.data["response_length"].max()),
            "time/advantages": t_adv,
            "time/step": step_time,
        }
        metrics.update(merge_rank_metrics(stage_stats, update_stats))
        generated = metrics["rollout_tokens"]
        metrics["tokens_per_s"] = generated / step_time
        if (cfg.eval.every and self.step % cfg.eval.every == 0) or self.step == cfg.max_steps:
            t_eval = time.perf_counter()
            metrics.update(self._all(self.actors[:1], "evaluate")[0])
            metrics["time/eval"] = time.perf_counter() - t_eval
        return metrics

    def _dp_balanced_rows(self) -> list[list[int]] | None:
        """Rows per DP rank with even token totals (whole prompt groups, equal counts), or None."""
        world = len(self.actors)
        if world == 1 or not self.config.batching.dp_balance:
            return None
        from entrepot.batching import balance_across_ranks

        rows = torch.arange(self.config.rollout.batch_size)  # the dock holds exactly one step's rows
        batch = self.dock.peek(["prompt_length", "response_length"], rows)
        lengths = (batch.data["prompt_length"] + batch.data["response_length"]).tolist()
        plan = balance_across_ranks(lengths, world, group_size=self.config.rollout.n_samples_per_prompt,
                                    equal_count=True)  # fmt: skip
        return [[int(rows[i]) for i in rank] for rank in plan.ranks]

    def _advantages(self) -> torch.Tensor:
        """Group-normalised advantages for all rows, put back as per-response-token values."""
        cfg = self.config
        n = cfg.rollout.n_samples_per_prompt
        columns = ["rm_scores", "response_length"]
        kl_in_reward = cfg.algorithm.kl_in_reward and cfg.algorithm.kl_coef > 0
        columns += ["ref_log_prob", "old_log_prob"] if kl_in_reward else []
        batch = self.dock.get("compute_advantage", columns, cfg.rollout.batch_size)
        order = batch.indexes.argsort()  # rows of a prompt group are contiguous in the dock
        scores = batch.data["rm_scores"][order].float()
        if kl_in_reward:
            ref = torch.nn.utils.rnn.pad_sequence(
                [column_rows(batch, "ref_log_prob")[i] for i in order], True
            )
            old = torch.nn.utils.rnn.pad_sequence(
                [column_rows(batch, "old_log_prob")[i] for i in order], True
            )
            mask = (torch.arange(ref.shape[1])[None] < batch.data["response_length"][order][:, None]).float()
            advantages = shaped_advantages(
                scores, n, cfg.algorithm, logp=old, ref_logp=ref, response_mask=mask
            )
        else:
            advantages = shaped_advantages(scores, n, cfg.algorithm)
        if cfg.algorithm.dynamic_sampling:
            from entrepot.grpo.algorithm import keep_varied_groups

            advantages = advantages * keep_varied_groups(scores, n)
        lengths = batch.data["response_length"][order].tolist()
        values = [
            torch.full((max(1, length),), float(a))
            for a, length in zip(advantages.tolist(), lengths, strict=True)
        ]
        self.dock.put({"advantages": values}, batch.indexes[order])
        return scores

    # -- checkpoints ----------------------------------------------------------------------------

    def save(self) -> Path:
        """Write a checkpoint of the current step and prune old ones."""
        states = self._all(self.actors, "state")
        directory = self.run_dir / "checkpoints" / f"step_{self.step:06d}"
        meta = {"step": self.step, "data_position": self.step * self.config.rollout.prompts_per_step,
                "config": config_to_dict(self.config)}  # fmt: skip
        ckpt.write_checkpoint(directory, states, meta, dock=lambda path: self.dock.save(str(path)))
        ckpt.prune(self.run_dir, self.config.checkpoint.keep_last)
        return directory

    def _resume(self) -> None:
        directory = ckpt.latest_checkpoint(self.run_dir)
        if directory is None:
            from entrepot.grpo.errors import CheckpointError

            raise CheckpointError(
                f"nothing to resume: {str(self.run_dir)!r} has no checkpoints/step_* directory"
            )
        for rank, actor in enumerate(self.actors):
            state, meta = ckpt.read_checkpoint(directory, rank)
            self._all([actor], "load_state", state)
        if (directory / "dock.pt").is_file():
            self.dock.load(str(directory / "dock.pt"))
        self.step = int(meta["step"])
        self.metrics.truncate(self.step)  # steps after the checkpoint run again
        (self.run_dir / "resumed_from.json").write_text(
            json.dumps({"checkpoint": str(directory), "step": self.step})
        )

    def parameters(self, rank: int = 0) -> dict[str, torch.Tensor]:
        """A copy of rank `rank`'s trainable parameters."""
        return dict(self._all(self.actors[rank : rank + 1], "parameters_digest")[0])

    def close(self) -> None:
        """Stop the workers (the Ray runtime itself stays up for the next run in this process)."""
        self.metrics.close()
        self._all(self.actors, "shutdown")
        if self.config.resources.use_ray:
            import ray

            for actor in [*self.actors, *self.rewarders, self.dock.actor]:
                ray.kill(actor)
