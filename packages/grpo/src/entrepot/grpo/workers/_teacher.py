"""The teacher log-prob stage of on-policy distillation, on the actor ranks beside the reference stage.

After generation, each actor rank takes rollout rows from the dock (consumer `TEACHER_STAGE`) and
scores exactly their sampled response tokens twice at the rollout's temperature, log_softmax(logits /
rollout.temperature): under the frozen teacher (`teacher_log_prob`) and under the current policy,
which in synchronous training is the one that sampled them (`student_log_prob`). The old log-prob
stage is not reused for the student: it scores at temperature 1 (the PPO ratio's, as every other
log-prob pass does), and runs only when the update takes several optimiser steps. The step turns the
two columns into per-token advantages (`algo.distill`). The teacher is on the device only for the
stage when `engine.offload_reference` is on, like the reference.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from entrepot.dock import Batch, DockClient
from entrepot.grpo.algo.distill import distill_metrics, token_advantages
from entrepot.grpo.config import DistillConfig, GRPOConfig
from entrepot.grpo.engines.frozen import FrozenOnDemand
from entrepot.grpo.workers._stage import SEQUENCE_COLUMNS, stage
from entrepot.grpo.workers._update_inputs import TOKEN_ADVANTAGES, response_batch

if TYPE_CHECKING:
    from entrepot.grpo.engines.policy import Policy
    from entrepot.grpo.run.teacher import TeacherSource
    from entrepot.grpo.workers._memory import PhaseMemory
    from entrepot.grpo.workers._stage import DockReader
    from entrepot.grpo.workers.ranks import RankInfo

__all__ = [
    "DISTILL_COLUMNS",
    "STUDENT_COLUMN",
    "TEACHER_COLUMN",
    "TEACHER_STAGE",
    "TOKEN_ADVANTAGES",
    "Teacher",
    "TeacherStage",
    "distill_advantages",
]

TEACHER_STAGE = "teacher_log_prob"  # the dock consumer of the stage
TEACHER_COLUMN = "teacher_log_prob"  # flat per row: the teacher's log-prob of each sampled token
STUDENT_COLUMN = "student_log_prob"  # flat per row: the sampling policy's, at the same temperature
DISTILL_COLUMNS = [TEACHER_COLUMN, STUDENT_COLUMN]


def distill_advantages(
    batch: Batch, advantages: torch.Tensor, distill: DistillConfig, multiturn: bool
) -> tuple[tuple[torch.Tensor, torch.Tensor], dict[str, float]]:
    """The per-token advantages of a packed batch (its `DISTILL_COLUMNS`, `response_length` and, with
    multi-turn, `model_mask`) given its per-response `advantages` [B]: (flat [R], lengths [B]) for the
    dock's `TOKEN_ADVANTAGES`, and the distill/* metrics."""
    data = batch.columns
    mask = data["model_mask"].bool() if multiturn else None  # [R]: no advantage on environment tokens
    teacher, student, lengths = data[TEACHER_COLUMN], data[STUDENT_COLUMN], data["response_length"]
    tokens = token_advantages(advantages, teacher, student, lengths, coef=distill.coef,
                              reward_weight=distill.reward_weight, model_mask=mask)  # fmt: skip
    return (tokens, lengths), distill_metrics(teacher, student, mask)


class Teacher:
    """The frozen teacher of `algorithm.distill.teacher` on this rank.

    Args:
        source: the resolved teacher (`run.teacher.resolve_teacher`).
        model: the loaded teacher.
        temperature: the rollout's temperature (both log-probs are taken at it).
        offload: keep the teacher in host memory outside its stage.
    """

    def __init__(self, source: TeacherSource, model: torch.nn.Module, temperature: float, *, offload: bool):
        self.source, self.model, self.temperature = source, model, temperature
        self.frozen = FrozenOnDemand(model.parameters(), offload=offload)

    @classmethod
    def build(cls, config: GRPOConfig) -> Teacher | None:
        """The configured teacher, loaded on `engine.device`; None without distillation."""
        path = config.algorithm.distill.teacher
        if path is None:
            return None
        from entrepot.grpo.run.teacher import load_teacher, resolve_teacher

        source = resolve_teacher(path)
        model = load_teacher(source, config.engine.device)
        return cls(source, model, config.rollout.temperature, offload=config.engine.reference_offloaded)


class TeacherStage:
    """The actor worker's teacher stage (a mixin: `ActorWorker` holds the attributes it reads)."""

    role: str
    config: GRPOConfig
    rank: RankInfo
    reader: DockReader
    policy: Policy
    memory: PhaseMemory
    teacher: Teacher | None

    @stage(TEACHER_STAGE)
    def teacher_logprobs(
        self, dock: DockClient, count: int, rows: Sequence[int] | None = None
    ) -> dict[str, float]:
        """Teacher and student log-probs of the sampled tokens at the rollout's temperature (flat, per row)
        into the dock, `count` rows at a time (of `rows` only, when given); distill/teacher_step names
        the teacher's checkpoint step (0: an HF directory)."""
        from entrepot.grpo.algo.update import compute_logprobs

        teacher = self.teacher
        assert teacher is not None, "the step runs this stage only with algorithm.distill.teacher"
        t0 = time.perf_counter()
        stats: dict[str, float] = {}
        trainer, n, pad = self.policy.trainer, self.config.rollout.n_samples_per_prompt, self._pad_id
        with self.memory.phase("teacher_log_prob", stats) as sample, teacher.frozen.resident():
            sample(self.policy.manager.enter_forward_mode())
            for batch in self.reader.stage_batches(dock, TEACHER_STAGE, SEQUENCE_COLUMNS, count, n, rows):
                sequences = response_batch(batch)
                scored = compute_logprobs(teacher.model, sequences, self.config.batching, "ref_log_prob",
                                          pad_token_id=pad, temperature=teacher.temperature)  # fmt: skip
                student = trainer.logprobs(sequences, "old_log_prob", reference=False,
                                           temperature=teacher.temperature)  # fmt: skip
                if trainer.is_last_stage and trainer.tp_rank == 0 and student is not None:
                    lengths = sequences.response_lengths
                    out = {TEACHER_COLUMN: (scored, lengths), STUDENT_COLUMN: (student.float(), lengths)}
                    dock.put(out, batch.indexes)
            self.policy.manager.exit_forward_mode()
        stats["time/teacher"] = time.perf_counter() - t0
        stats["distill/teacher_step"] = float(teacher.source.step or 0)
        return stats

    def teacher_description(self) -> str:
        """The start-up line naming the loaded teacher (`run.teacher.TeacherSource.describe`)."""
        return "" if self.teacher is None else self.teacher.source.describe()

    @property
    def _pad_id(self) -> int:
        return int(self.policy.setup.tokenizer.pad_token_id)
