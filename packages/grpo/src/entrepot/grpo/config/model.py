"""The policy model and its prompts: the `model` and `data` sections.

Whether a synthetic task's prompt + response fits `model.max_positions` depends on the task's token
lengths, which the data wing owns: `entrepot.grpo.data.checks` checks it before a run starts.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal

from entrepot.grpo.config.fields import check, check_choice, doc
from entrepot.grpo.config.lora import LoraConfig
from entrepot.grpo.config.word_problems import WordProblemsConfig

__all__ = ["Architecture", "DataConfig", "ModelConfig", "ReferenceDtype", "TaskName"]

TaskName = Literal["reverse", "addition", "word_problems", "code_functions", "jsonl", "parquet"]
Architecture = Literal["gpt2", "qwen2"]
ReferenceDtype = Literal["float32", "bfloat16"]


@dataclass(kw_only=True)
class ModelConfig:
    """The policy model: a local HF model directory, or a decoder built from this config (random init)."""

    path: str | None = field(
        default=None,
        metadata=doc("Local HF model directory (config, weights, tokenizer). None builds the decoder below."),
    )
    architecture: Architecture = field(
        default="gpt2",
        metadata=doc(
            "Built decoder: gpt2 (learned positions, LayerNorm, GELU; the default) or qwen2 (rotary, "
            "RMSNorm, SwiGLU, grouped-query attention, tied embeddings)."
        ),
    )
    num_layers: int = field(default=2, metadata=doc("Transformer blocks of the built decoder."))
    hidden_size: int = field(default=64, metadata=doc("Hidden width of the built decoder."))
    num_heads: int = field(
        default=2,
        metadata=doc(
            "Attention heads of the built decoder (must divide hidden_size). The default's head_dim "
            "32 is the smallest vLLM's CPU attention serves."
        ),
    )
    num_kv_heads: int | None = field(
        default=None, metadata=doc("Key/value heads of a built qwen2 (None = num_heads; gpt2: None).")
    )
    intermediate_size: int | None = field(
        default=None, metadata=doc("MLP width of the built decoder (None = 4 x hidden_size).")
    )
    max_positions: int = field(
        default=32, metadata=doc("Positions of the built decoder (prompt + response tokens).")
    )
    init_std: float = field(default=0.02, metadata=doc("Std of the normal init of the built decoder."))
    ref_model_load_path: str | None = field(
        default=None,
        metadata=doc(
            "Local HF model directory of the reference (the KL anchor), same vocabulary as the policy "
            "(and, with engine.train=megatron, the same shape); None = the policy's initial weights."
        ),
    )
    reference_dtype: ReferenceDtype = field(
        default="float32",
        metadata=doc(
            "Dtype of the frozen reference's weights: float32, or bfloat16 (half the memory; its "
            "log-probs are still computed in float32 from its logits). engine.train=torch only."
        ),
    )

    lora: LoraConfig = field(
        default_factory=LoraConfig,
        metadata=doc("LoRA adapters (peft) instead of full training: rank, alpha, dropout, target_modules."),
    )

    def __post_init__(self) -> None:
        check_choice("model.architecture", self.architecture, typing.get_args(Architecture))
        check_choice("model.reference_dtype", self.reference_dtype, typing.get_args(ReferenceDtype))
        for name in ("num_layers", "hidden_size", "num_heads", "max_positions"):
            check(getattr(self, name) >= 1, f"model.{name}", getattr(self, name), ">= 1")
        check(
            self.hidden_size % self.num_heads == 0,
            "model.hidden_size",
            self.hidden_size,
            f"divisible by model.num_heads ({self.num_heads})",
        )
        if self.num_kv_heads is not None:
            check(self.architecture == "qwen2", "model.num_kv_heads", self.num_kv_heads,
                   "null with model.architecture='gpt2' (GPT-2 has no grouped-query attention)")  # fmt: skip
            check(
                self.num_kv_heads >= 1 and self.num_heads % self.num_kv_heads == 0,
                "model.num_kv_heads",
                self.num_kv_heads,
                f"a divisor of model.num_heads ({self.num_heads})",
            )
        if self.intermediate_size is not None:
            check(self.intermediate_size >= 1, "model.intermediate_size", self.intermediate_size, ">= 1")
        check(self.init_std > 0, "model.init_std", self.init_std, "> 0")

    @property
    def kv_heads(self) -> int:
        """Key/value heads of the built decoder."""
        return self.num_kv_heads or self.num_heads


@dataclass(kw_only=True)
class DataConfig:
    """Where prompts come from: a built-in synthetic task or a local jsonl/parquet file."""

    task: TaskName = field(
        default="reverse",
        metadata=doc(
            "reverse | addition (synthetic, character tokenizer) | word_problems (generated arithmetic "
            "word problems, GSM8K '#### N' answers; needs model.path) | code_functions (generated "
            "Python function-writing problems with hidden tests, scored by code_tests) | jsonl | parquet "
            "(local files)."
        ),
    )
    num_digits: int = field(default=8, metadata=doc("Digits per operand of the synthetic tasks."))
    word_problems: WordProblemsConfig = field(
        default_factory=WordProblemsConfig,
        metadata=doc("Difficulty of data.task=word_problems: steps, max_operand, operations."),
    )
    train_path: str | None = field(
        default=None, metadata=doc("jsonl/parquet file with training prompts (tasks jsonl, parquet).")
    )
    eval_path: str | None = field(
        default=None, metadata=doc("jsonl/parquet file with held-out prompts; None holds out from train.")
    )
    prompt_field: str = field(default="prompt", metadata=doc("Record field holding the prompt text."))
    answer_field: str = field(default="answer", metadata=doc("Record field holding the reference answer."))
    apply_chat_template: bool = field(
        default=True, metadata=doc("Wrap prompts in the tokenizer's chat template when it has one.")
    )
    max_prompt_tokens: int = field(
        default=256, metadata=doc("Prompts longer than this are an error (never silently truncated).")
    )
    shuffle: bool = field(default=True, metadata=doc("Shuffle the training prompts each epoch (seeded)."))

    def __post_init__(self) -> None:
        check_choice("data.task", self.task, typing.get_args(TaskName))
        check(1 <= self.num_digits <= 32, "data.num_digits", self.num_digits, "between 1 and 32")
        check(self.max_prompt_tokens >= 1, "data.max_prompt_tokens", self.max_prompt_tokens, ">= 1")
        if self.task in ("jsonl", "parquet"):
            check(
                self.train_path is not None,
                "data.train_path",
                None,
                f"a file path when data.task={self.task!r}",
            )
