"""On-policy distillation (`algorithm.distill`): the per-token advantage formula, log-probs at a
temperature, the loss's per-token advantage path, and the refusals before start.

The end-to-end test (``integration``) trains a teacher one step, saves it as a checkpoint, runs two
distillation steps on the embedded default and recomputes the teacher's and the student's log-probs
of the rollout's own tokens at the rollout's temperature offline.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tests_support_models import built_default_dir, tiny_model_dir

from entrepot.grpo import load_config
from entrepot.grpo.algo.distill import distill_metrics, token_advantages
from entrepot.grpo.algo.sequences import ResponseBatch, response_logprobs
from entrepot.grpo.algo.update import UpdateInputs, micro_batch_loss, mini_batch_counts
from entrepot.grpo.config import AlgorithmConfig
from entrepot.grpo.engines.models import build_model
from entrepot.grpo.errors import DataError, GRPOConfigError
from entrepot.grpo.run.preflight import check_inputs

VOCAB = 16


def _batch(prompt_lengths: list[int], response_lengths: list[int], seed: int = 0) -> ResponseBatch:
    gen = torch.Generator().manual_seed(seed)
    p, r = torch.tensor(prompt_lengths), torch.tensor(response_lengths)
    return ResponseBatch.from_packed(
        torch.randint(2, VOCAB, (int(p.sum()),), generator=gen), p,
        torch.randint(2, VOCAB, (int(r.sum()),), generator=gen), r,
    )  # fmt: skip


def test_token_advantages_match_a_numpy_reference_with_a_mask() -> None:
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 1, 4, 2])
    seq = torch.tensor([0.5, -1.0, 2.0, 0.0])
    teacher = -3 * torch.rand(10, generator=gen)
    student = -3 * torch.rand(10, generator=gen)
    mask = torch.tensor([1, 1, 0, 1, 1, 0, 0, 1, 1, 1], dtype=torch.bool)
    got = token_advantages(seq, teacher, student, lengths, coef=0.7, reward_weight=0.25, model_mask=mask)

    t, s, m = teacher.numpy().astype(np.float64), student.numpy().astype(np.float64), mask.numpy()
    expected = []
    for row, n in enumerate(lengths.tolist()):
        start = int(lengths[:row].sum())
        for k in range(start, start + n):
            expected.append((0.25 * float(seq[row]) + 0.7 * (t[k] - s[k])) if m[k] else 0.0)
    np.testing.assert_allclose(got.numpy(), np.array(expected), rtol=0, atol=1e-6)
    assert got.dtype == torch.float32 and not got.requires_grad

    pure = token_advantages(seq, teacher, student, lengths, coef=1.0, reward_weight=0.0)  # no mask
    np.testing.assert_allclose(pure.numpy(), t - s, rtol=0, atol=1e-6)
    metrics = distill_metrics(teacher, student, mask)
    assert metrics["distill/reverse_kl"] == pytest.approx(float(np.mean((s - t)[m])), abs=1e-9)
    assert metrics["distill/teacher_logp_mean"] == pytest.approx(float(np.mean(t[m])), abs=1e-9)
    with pytest.raises(ValueError, match="response_lengths"):
        token_advantages(seq, teacher, student, torch.tensor([3, 1, 4]), coef=1.0, reward_weight=0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_log_probs_at_a_temperature_are_the_scaled_softmax(temperature: float) -> None:
    """Both paths (the chunked head of the built decoder, HF's full logits of a GPT-2) score under
    log_softmax(logits / temperature), packed or padded."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = load_config(None, ["model.max_positions=64"])
    torch.manual_seed(0)
    built = build_model(config.model, VOCAB, pad_token_id=0, eos_token_id=1).eval()
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=16, n_layer=1, n_head=2)).eval()
    batch = _batch([3, 2, 4], [5, 3, 2])
    for model in (built, hf):
        ids, mask = batch.padded(0)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits.float()  # [B, L, V]
        expected = []
        for row in range(batch.num_rows):
            p, r = int(batch.prompt_lengths[row]), int(batch.response_lengths[row])
            scaled = F.log_softmax(logits[row, p - 1 : p + r - 1] / temperature, dim=-1)  # [r, V]
            expected.append(scaled.gather(-1, ids[row, p : p + r, None]).squeeze(-1))
        for packed in (True, False):
            with torch.no_grad():
                got, _ = response_logprobs(model, batch, packed=packed, temperature=temperature)
            torch.testing.assert_close(got, torch.cat(expected), atol=2e-5, rtol=0)


def test_the_loss_reads_per_token_advantages_when_given() -> None:
    """Per-token advantages equal to the broadcast per-response ones give the same loss; others change
    it; the per-response path is unchanged when none are given."""
    batch = _batch([2, 3, 2], [4, 2, 3])
    rows = torch.arange(batch.num_rows)
    algo = AlgorithmConfig(kl_coef=0.0)
    gen = torch.Generator().manual_seed(1)
    logp = (-2 * torch.rand(batch.num_response_tokens, generator=gen)).requires_grad_(True)
    old = logp.detach() + 0.1 * torch.randn(logp.shape, generator=gen)
    advantages = torch.tensor([1.0, -0.5, 0.25])
    plain = UpdateInputs(batch, advantages, old, None, [rows])
    same = dataclasses.replace(plain, token_advantages=batch.per_token(advantages))
    other = dataclasses.replace(plain, token_advantages=torch.randn(logp.shape, generator=gen))
    normalizer, num_tokens = mini_batch_counts(plain, rows, algo, None)
    losses = [float(micro_batch_loss(i, rows, batch, logp, None, algo, normalizer, num_tokens).loss.detach())
              for i in (plain, same, other)]  # fmt: skip
    assert losses[0] == losses[1]
    assert abs(losses[2] - losses[0]) > 1e-3


def test_the_config_refuses_what_distillation_does_not_run_with() -> None:
    teacher = "algorithm.distill.teacher=some/teacher"
    assert not load_config(None, []).algorithm.distill.enabled
    config = load_config(None, [teacher, "algorithm.distill.coef=0.5", "algorithm.distill.reward_weight=1"])
    assert config.algorithm.distill.enabled and config.algorithm.distill.coef == 0.5
    refusals = {
        r"engine\.train \('megatron'\) must be 'torch' .*megatron is not wired": ["engine.train=megatron"],
        r"trainer\.mode \('async'\) must be 'sync'": ["trainer.mode=async"],
        r"rollout\.partial_max_tokens \(4\) must be null": ["rollout.partial_max_tokens=4"],
        r"algorithm\.distill\.coef \(0\.0\) must be > 0 when .*reward_weight is 0": [
            "algorithm.distill.coef=0"
        ],
        r"algorithm\.distill\.teachers .* must be empty: a teacher per row .* not built yet": [
            "algorithm.distill.teachers={a: some/teacher}"
        ],
        r"algorithm\.distill\.teacher_column \('task'\) must be null": [
            "algorithm.distill.teacher_column=task"
        ],
    }
    for message, overrides in refusals.items():
        with pytest.raises(GRPOConfigError, match=message):
            load_config(None, [teacher, *overrides])


def test_preflight_checks_the_teacher_path_and_vocabulary(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"algorithm\.distill\.teacher \('.*nowhere'\): .*does not exist"):
        check_inputs(load_config(None, [f"algorithm.distill.teacher={tmp_path / 'nowhere'}"]))
    words = tiny_model_dir(tmp_path / "words")  # a word-level tokenizer: another vocabulary
    with pytest.raises(DataError, match=r"algorithm\.distill\.teacher .* has a vocabulary of \d+ tokens, the "
                                        r"policy \d+: .*same tokenizer"):  # fmt: skip
        check_inputs(load_config(None, [f"algorithm.distill.teacher={words}"]))
    same = built_default_dir(tmp_path / "same", seed=3)
    check_inputs(load_config(None, [f"algorithm.distill.teacher={same}"]))
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    with pytest.raises(DataError, match=r"algorithm\.distill\.teacher .*no complete checkpoint"):
        check_inputs(load_config(None, [f"algorithm.distill.teacher={tmp_path / 'run'}"]))


# -- end to end ---------------------------------------------------------------------------------

QUICK = ["resources.use_ray=false", "logging.tensorboard=false", "eval.every=0", "eval.num_prompts=8",
         "rollout.prompts_per_step=4"]  # fmt: skip


def _offline_logprobs(model: torch.nn.Module, columns: dict[str, Any], temperature: float) -> torch.Tensor:
    """log_softmax(logits / temperature) of each sampled token, one row at a time through HF's forward."""
    out = []
    prompts = columns["prompts"].split(columns["prompt_lengths"].tolist())
    responses = columns["responses"].split(columns["response_lengths"].tolist())
    for prompt, response in zip(prompts, responses, strict=True):
        ids = torch.cat([prompt, response]).long()[None]  # [1, p + r]
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()  # [p + r, V]
        scaled = F.log_softmax(logits[len(prompt) - 1 : -1] / temperature, dim=-1)  # [r, V]
        out.append(scaled.gather(-1, response.long()[:, None]).squeeze(-1))
    return torch.cat(out)


@pytest.mark.integration
def test_two_distillation_steps_score_the_rollout_tokens_at_its_temperature(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from entrepot.grpo import train
    from entrepot.grpo.engines.policy import initial_model
    from entrepot.grpo.run.export import checkpoint_directory, load_trained
    from entrepot.grpo.trainer import Trainer
    from entrepot.grpo.workers import ActorWorker

    teacher_run = tmp_path / "teacher"
    teacher_config = load_config(None, [*QUICK, "max_steps=1", "seed=5", "algorithm.lr=0.01"])
    train(teacher_config, teacher_run)
    checkpoint = checkpoint_directory(teacher_run)

    temperature = 0.8
    config = load_config(None, [
        *QUICK, "max_steps=2", f"rollout.temperature={temperature}",
        f"algorithm.distill.teacher={teacher_run}", "algorithm.distill.coef=1.0",
        "algorithm.distill.reward_weight=0.5",
    ])  # fmt: skip
    check_inputs(config)
    seen: list[dict[str, Any]] = []
    stage = ActorWorker.teacher_logprobs

    def recording(worker: ActorWorker, dock: Any, count: int, rows: Any = None) -> dict[str, float]:
        """The real stage; then what it wrote, read from the dock without consuming (rows of the step)."""
        stats = stage(worker, dock, count, rows)
        live = torch.arange(config.rollout.batch_size)
        got = dock.peek(
            ["prompts", "responses", "teacher_log_prob", "student_log_prob"], live, layout="packed"
        )
        data, lengths = got.columns, got.lengths
        seen.append({"prompts": data["prompts"], "prompt_lengths": lengths["prompts"],
                     "responses": data["responses"], "response_lengths": lengths["responses"],
                     "teacher": data["teacher_log_prob"], "student": data["student_log_prob"]})  # fmt: skip
        return stats

    monkeypatch.setattr(ActorWorker, "teacher_logprobs", recording)
    trainer = Trainer(config, tmp_path / "student")
    try:
        rows = trainer.fit()
    finally:
        trainer.close()
    assert [r["step"] for r in rows] == [1, 2] and len(seen) == 2
    for r in rows:
        assert r["distill/teacher_step"] == 1.0 and r["distill/teacher_logp_mean"] < 0
        assert r["distill/reverse_kl"] > 0 and r["grad_norm"] > 0  # a teacher of other weights

    teacher, _ = load_trained(checkpoint, teacher_config)
    student, _ = initial_model(config)  # the policy that sampled step 1
    first = seen[0]
    lengths = first["response_lengths"]
    assert int(lengths.sum()) == first["teacher"].numel() == first["student"].numel()
    offline_teacher = _offline_logprobs(teacher.eval(), first, temperature)
    offline_student = _offline_logprobs(student.eval(), first, temperature)
    torch.testing.assert_close(first["teacher"], offline_teacher, atol=1e-5, rtol=0)
    torch.testing.assert_close(first["student"], offline_student, atol=1e-5, rtol=0)
    kl = torch.stack([part.sum() for part in (first["student"] - first["teacher"]).split(lengths.tolist())])
    offline_kl = torch.stack(
        [part.sum() for part in (offline_student - offline_teacher).split(lengths.tolist())]
    )
    torch.testing.assert_close(kl, offline_kl, atol=1e-5, rtol=0)  # each sample's summed KL
    untempered = _offline_logprobs(teacher.eval(), first, 1.0)
    assert (first["teacher"] - untempered).abs().max() > 1e-3  # the temperature was applied
    assert rows[0]["distill/reverse_kl"] == pytest.approx(float(kl.sum() / lengths.sum()), abs=1e-5)


def test_the_docs_yaml_block_is_a_valid_config() -> None:
    import yaml

    from entrepot.grpo.config import config_from_dict

    text = (Path(__file__).parents[1] / "docs" / "distillation.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    distill = config_from_dict(yaml.safe_load(block)).algorithm.distill
    assert (distill.teacher, distill.coef, distill.reward_weight) == ("runs/teacher-run", 1.0, 0.0)
