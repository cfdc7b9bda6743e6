"""The workers of the full system: a co-located actor (train + rollout + reference) and rule rewards.

Both are plain classes; `trainer.py` turns them into Ray actors (`ray.remote(...)`), passing a
dock client (`entrepot.dock.DockClient`: the in-process `GRPODock` or a `RayDockClient`) through
which every stage reads its input columns and writes its outputs. Stages never call each other.

The actor worker holds, on one device, the training model, the rollout engine (weights in the
inference layout) and the reference model, and switches between them with entrepot.resharding's
`ShardingManager`: `enter_infer_mode` reshards train -> infer and loads the engine; train mode
onloads what the update needs. With several actor workers (data parallel) each takes its share of
rows from the dock and gradients are averaged with torch.distributed (gloo on CPU).

Dock columns hold response-aligned values (`ref_log_prob`, `advantages`: one value per response
token), as upstream does; the worker scatters them onto the [B, T] next-token grid.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from entrepot.dock import Batch, DockClient
from entrepot.grpo import rewards
from entrepot.grpo.config import GRPOConfig, config_from_dict
from entrepot.grpo.data import TaskSetup, build_task
from entrepot.grpo.evaluation import greedy_eval
from entrepot.grpo.model import build_model, load_pretrained
from entrepot.grpo.rollout import GPT2RolloutEngine, SamplingParams
from entrepot.grpo.stages import TokenBatch, actor_update, compute_logprobs, make_token_batch
from entrepot.grpo.threads import configure_threads
from entrepot.grpo.training import build_optimizer

__all__ = ["ActorWorker", "RewardWorker", "column_rows", "tensor_text", "text_tensor"]


def take(
    dock: DockClient, consumer: str, columns: Sequence[str], count: int, indexes: Sequence[int] | None = None
) -> Batch:
    """`dock.get` for a stage that must receive rows this iteration (None would be a loop bug).

    `indexes` asks for exactly those rows (the driver's DP balance plan), else the next `count`.
    """
    batch = dock.get(consumer, list(columns), count, indexes=indexes)
    if batch is None:
        raise RuntimeError(f"dock has no rows left for stage {consumer!r}; the step was already consumed")
    return batch


def column_rows(batch: Any, column: str) -> list[torch.Tensor]:
    """The valid part of each row of a padded dock batch's sequence column (list of 1-D tensors)."""
    values = batch.data[column]
    lengths = batch.lengths[column].tolist()
    return [values[i, :n] for i, n in enumerate(lengths)]


def text_tensor(text: str) -> torch.Tensor:
    """UTF-8 bytes of `text` as a uint8 tensor (how answers travel through the dock)."""
    return torch.tensor(list(text.encode("utf-8")) or [0], dtype=torch.uint8)


def tensor_text(tensor: torch.Tensor) -> str:
    return bytes(tensor.tolist()).decode("utf-8").rstrip("\x00")


def response_grid(values: Sequence[torch.Tensor], batch: TokenBatch) -> torch.Tensor:
    """Scatter response-aligned values (one per response token) onto the [B, T] next-token grid."""
    out = torch.zeros_like(batch.response_mask)
    for row, v in enumerate(values):
        start = int(batch.prompt_lengths[row]) - 1
        out[row, start : start + v.numel()] = v.float()
    return out


def response_values(grid: torch.Tensor, batch: TokenBatch) -> list[torch.Tensor]:
    """The inverse of `response_grid`: each row's values on its response tokens."""
    out = []
    for row in range(grid.shape[0]):
        start = int(batch.prompt_lengths[row]) - 1
        out.append(grid[row, start : start + int(batch.response_lengths[row])].clone())
    return out


class ActorWorker:
    """One data-parallel rank of the co-located actor: rollout, reference, (old) log-probs, update.

    Args:
        config: the run's config as a dict (`config_to_dict`), rebuilt here.
        rank, world_size: this worker's DP rank and the number of actor workers.
        dist_init: ``tcp://host:port`` for torch.distributed when world_size > 1.
    """

    def __init__(
        self, config: Mapping[str, Any], rank: int = 0, world_size: int = 1, dist_init: str = ""
    ) -> None:
        self.config: GRPOConfig = config_from_dict(config)
        cfg = self.config
        configure_threads(cfg.threads, interop=True)
        torch.manual_seed(cfg.seed)  # every rank builds the same initial weights
        self.rank, self.world_size = rank, world_size
        tokenizer = None
        if cfg.model.path is not None:
            self.model, tokenizer = load_pretrained(cfg.model.path)
        self.setup: TaskSetup = build_task(cfg, tokenizer)
        tok = self.setup.tokenizer
        if cfg.model.path is None:
            self.model = build_model(cfg.model, tok.vocab_size, pad_token_id=tok.pad_token_id,
                                     eos_token_id=tok.eos_token_id)  # fmt: skip
        self.model.to(cfg.engine.device)
        self.reference = (
            copy.deepcopy(self.model).requires_grad_(False) if cfg.algorithm.kl_coef > 0 else None
        )
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg)
        self.generator = torch.Generator().manual_seed(cfg.seed + 7919 * (rank + 1))
        self.engine, self.manager = self._engines()
        self._exit_infer_s = 0.0
        self.sampling = SamplingParams(
            temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
            max_new_tokens=self.setup.max_new_tokens,
            stop_token_ids=(tok.eos_token_id,) if cfg.rollout.stop_on_eos else (),
        )  # fmt: skip
        if world_size > 1:
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=dist_init, rank=rank, world_size=world_size)

    def _engines(self) -> tuple[Any, Any]:
        """The rollout engine and the ShardingManager joining it to the training model.

        GPT-2 gets the embedded engine in the fused inference layout; other architectures get an
        HF-layout generation copy (`HFRolloutEngine`). Both receive weights through the resharder.
        """
        from entrepot.grpo.errors import GRPOError
        from entrepot.resharding import LocalResharder, Offloader, ShardingManager
        from entrepot.resharding.adaptors import get_adaptor
        from entrepot.resharding.engines.torch import TorchTrainingEngine

        cfg = self.config
        if cfg.engine.train != "torch" or cfg.engine.rollout != "torch":
            raise GRPOError(
                f"engine.train={cfg.engine.train!r} / engine.rollout={cfg.engine.rollout!r}: the GRPO worker "
                "of entrepot-grpo 0.1 builds only the torch engines (resharding ships megatron/vllm adapters)"
            )
        architecture = type(self.model).__name__
        adaptor = get_adaptor(architecture, self.model.config)
        engine: Any
        if architecture == "GPT2LMHeadModel":
            engine = GPT2RolloutEngine.from_hf_config(self.model.config, device=cfg.engine.device)
            resharder = LocalResharder(adaptor, target="infer")
        else:
            from entrepot.grpo.rollout_hf import HFRolloutEngine

            engine = HFRolloutEngine(copy.deepcopy(self.model).requires_grad_(False).eval())
            resharder = LocalResharder(adaptor, target="hf")
        offload = cfg.engine.offload_train_in_rollout
        manager = ShardingManager(
            TorchTrainingEngine(self.model, adaptor),
            engine,
            resharder,
            Offloader(self.model, self.optimizer) if offload else None,
            offload_train_params=offload, offload_grads=offload, offload_optimizer=offload,
        )  # fmt: skip
        return engine, manager

    # -- stages ---------------------------------------------------------------------------------

    def rollout(self, dock: DockClient, count: int) -> dict[str, float]:
        """Reshard into the engine, generate this rank's share of responses, put them in the dock."""
        t0 = time.perf_counter()
        self.manager.enter_infer_mode()
        t1 = time.perf_counter()
        batch = take(dock, "actor_rollout", ["prompts"], count)
        prompts = [p.tolist() for p in column_rows(batch, "prompts")]
        tok = self.setup.tokenizer
        responses = self.engine.generate(
            prompts, self.sampling, pad_token_id=tok.pad_token_id, generator=self.generator
        )
        t2 = time.perf_counter()
        self.manager.exit_infer_mode()
        self._exit_infer_s = time.perf_counter() - t2
        dock.put(
            {
                "responses": [torch.tensor(r or [tok.pad_token_id], dtype=torch.long) for r in responses],
                "response_length": torch.tensor([len(r) for r in responses], dtype=torch.long),
            },
            batch.indexes,
        )
        tokens = sum(len(r) for r in responses)
        return {
            "time/reshard_to_infer": t1 - t0,
            "time/generate": t2 - t1,
            "rollout_tokens": float(tokens),
        }

    def _token_batch(self, batch: Any) -> TokenBatch:
        prompts = [p.tolist() for p in column_rows(batch, "prompts")]
        lengths = batch.data["response_length"].tolist()
        responses = [r[:n].tolist() for r, n in zip(column_rows(batch, "responses"), lengths, strict=True)]
        return make_token_batch(prompts, responses, self.setup.tokenizer.pad_token_id)

    def reference_logprobs(self, dock: DockClient, count: int) -> dict[str, float]:
        """Reference log-probs of this rank's share of responses (response-aligned) into the dock."""
        if self.reference is None:
            raise RuntimeError("reference stage called with algorithm.kl_coef == 0")
        t0 = time.perf_counter()
        batch = take(dock, "ref_log_prob", ["prompts", "responses", "response_length"], count)
        tokens = self._token_batch(batch)
        ref = compute_logprobs(self.reference, tokens, self.config.batching)
        dock.put({"ref_log_prob": response_values(ref, tokens)}, batch.indexes)
        return {"time/ref": time.perf_counter() - t0}

    def old_logprobs(self, dock: DockClient, count: int) -> dict[str, float]:
        """Log-probs of the sampling policy (needed when the update takes several optimiser steps)."""
        t0 = time.perf_counter()
        self.manager.enter_forward_mode()
        batch = take(dock, "actor_log_prob", ["prompts", "responses", "response_length"], count)
        tokens = self._token_batch(batch)
        old = compute_logprobs(self.model, tokens, self.config.batching)
        self.manager.exit_forward_mode()
        dock.put({"old_log_prob": response_values(old, tokens)}, batch.indexes)
        return {"time/old_logp": time.perf_counter() - t0}

    def update(
        self, dock: DockClient, count: int, *, with_old: bool, indexes: Sequence[int] | None = None
    ) -> dict[str, float]:
        """PPO-clip update on this rank's share (`indexes` when DP-balanced); grads averaged over ranks."""
        t0 = time.perf_counter()
        cfg = self.config
        columns = ["prompts", "responses", "response_length", "advantages"]
        columns += ["ref_log_prob"] if self.reference is not None and not cfg.algorithm.kl_in_reward else []
        columns += ["old_log_prob"] if with_old else []
        batch = take(dock, "actor_train", columns, count, indexes)
        tokens = self._token_batch(batch)
        advantages = response_grid(column_rows(batch, "advantages"), tokens)
        ref = response_grid(column_rows(batch, "ref_log_prob"), tokens) if "ref_log_prob" in columns else None
        old = response_grid(column_rows(batch, "old_log_prob"), tokens) if with_old else None
        t_switch = time.perf_counter()
        self.manager.enter_train_mode()
        to_train = self._exit_infer_s + time.perf_counter() - t_switch
        mini = cfg.algorithm.mini_batch_size
        metrics = actor_update(
            self.model, self.optimizer, self.scheduler, tokens, advantages, old, ref,
            cfg.algorithm, cfg.batching,
            mini_batch_size=None if mini is None else mini // self.world_size,
            all_reduce=self._all_reduce if self.world_size > 1 else None,
        )  # fmt: skip
        self.manager.exit_train_mode()
        metrics["time/update"] = time.perf_counter() - t0
        metrics["time/reshard_to_train"] = to_train
        metrics["train_tokens"] = float(tokens.attention_mask.sum())
        return metrics

    def _all_reduce(self, grads: list[torch.Tensor]) -> None:
        import torch.distributed as dist

        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def evaluate(self, num_prompts: int | None = None) -> dict[str, float]:
        """Greedy accuracy on held-out prompts with freshly resharded weights."""
        self.manager.enter_infer_mode()
        try:
            return greedy_eval(self.engine, self.setup, self.config, num_prompts)
        finally:
            self.manager.exit_infer_mode()

    # -- checkpoint state -----------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Model, reference, optimizer, scheduler and RNG state (tensors + JSON-able values)."""
        from entrepot.grpo.checkpoint import capture_state

        return capture_state(self)

    def load_state(self, state: Mapping[str, Any]) -> None:
        from entrepot.grpo.checkpoint import restore_state

        restore_state(self, state)

    def parameters_digest(self) -> dict[str, torch.Tensor]:
        """A copy of every trainable parameter (tests compare runs bit for bit)."""
        return {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def runtime_info(self) -> dict[str, Any]:
        """Thread settings as this process sees them (tests check the Ray workers)."""
        import os

        return {
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "torch_threads": torch.get_num_threads(),
            "pid": os.getpid(),
        }

    def shutdown(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


class RewardWorker:
    """Scores responses with the configured rule verifiers (a separate Ray actor)."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config_from_dict(config)
        configure_threads(self.config.threads, interop=True)
        rewards.resolve_custom(self.config.reward.custom)
        tokenizer = None
        if self.config.model.path is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.config.model.path, local_files_only=True)
        self.tokenizer = build_task(self.config, tokenizer).tokenizer

    def score(self, dock: DockClient, count: int) -> dict[str, float]:
        """Take `count` unscored responses, score them, put `rm_scores` and `accuracy`."""
        t0 = time.perf_counter()
        batch = take(dock, "rule_reward", ["responses", "response_length", "answer"], count)
        lengths = batch.data["response_length"].tolist()
        texts = [
            self.tokenizer.decode(r[:n].tolist(), skip_special_tokens=True)
            for r, n in zip(column_rows(batch, "responses"), lengths, strict=True)
        ]
        answers = [tensor_text(a) for a in column_rows(batch, "answer")]
        reward = self.config.reward
        scores = rewards.score(texts, answers, reward.verifiers)
        correct = rewards.score(texts, answers, {reward.accuracy_verifier: 1.0})
        dock.put(
            {
                "rm_scores": torch.tensor(scores, dtype=torch.float32),
                "accuracy": torch.tensor([float(c >= 1.0) for c in correct], dtype=torch.float32),
            },
            batch.indexes,
        )
        return {"time/reward": time.perf_counter() - t0}
