"""How responses are scored: the `reward` section (rule verifiers and learned reward models)."""

from __future__ import annotations

from dataclasses import dataclass, field

from entrepot.grpo.config.fields import check, doc

__all__ = ["CODE_VERDICTS", "CodeRewardConfig", "RewardConfig"]

# the sandbox's verdicts (entrepot.grpo.sandbox.Verdict; config imports no other wing)
CODE_VERDICTS = ("pass", "fail", "timeout", "crash", "memory", "syntax")


@dataclass(kw_only=True)
class CodeRewardConfig:
    """The ``code_tests`` verifier: the sandbox's limits and how a run's verdict becomes a reward."""

    timeout_s: float = field(
        default=5.0, metadata=doc("Wall seconds a program and its tests may run (also its CPU-second limit).")
    )
    memory_mb: int = field(default=512, metadata=doc("Address space a program may use (RLIMIT_AS), in MB."))
    output_kb: int = field(
        default=1024, metadata=doc("Largest file, stdout and stderr included, a program may write, in KB.")
    )
    partial_credit: bool = field(
        default=True,
        metadata=doc("Reward = passed tests / total tests (any verdict); false: 1 if all passed, else 0."),
    )
    verdict_scores: dict[str, float] = field(
        default_factory=dict,
        metadata=doc(
            "A fixed reward for a verdict in place of the tests' credit, e.g. {syntax: -0.5, timeout: 0}. "
            "Verdicts: " + ", ".join(CODE_VERDICTS) + "."
        ),
    )
    max_workers: int = field(
        default=8, metadata=doc("Programs run at once: a batch of N takes about N / max_workers deadlines.")
    )
    require_isolation: bool = field(
        default=False,
        metadata=doc(
            "Refuse to run programs where the machine does not allow the sandbox's namespaces (no network, "
            "read-only filesystem); false: run them under the resource limits only, counted in metrics."
        ),
    )

    def __post_init__(self) -> None:
        check(0.1 <= self.timeout_s <= 600, "reward.code.timeout_s", self.timeout_s, "in [0.1, 600] seconds")
        check(self.memory_mb >= 64, "reward.code.memory_mb", self.memory_mb, ">= 64 (the interpreter)")
        check(self.output_kb >= 1, "reward.code.output_kb", self.output_kb, ">= 1")
        check(self.max_workers >= 1, "reward.code.max_workers", self.max_workers, ">= 1")
        for verdict, value in self.verdict_scores.items():
            check(verdict in CODE_VERDICTS, "reward.code.verdict_scores", verdict,
                  "a verdict: " + ", ".join(CODE_VERDICTS))  # fmt: skip
            check(isinstance(value, (int, float)) and not isinstance(value, bool) and value == value,
                  f"reward.code.verdict_scores.{verdict}", value, "a number")  # fmt: skip


@dataclass(kw_only=True)
class RewardConfig:
    """Rule verifiers and their weights; user verifiers are imported by dotted path."""

    verifiers: dict[str, float] = field(
        default_factory=lambda: {"partial_credit": 1.0},
        metadata=doc(
            "Verifier name -> weight. Built in: exact_match, gsm8k (the number after '####'; none, 0), "
            "gsm8k_lenient (gsm8k, or the last number without '####'), boxed_math (the last \\boxed{}), "
            "format, partial_credit, code_tests (runs the response's code against the row's tests: "
            "reward.code). The math ones compare with math-verify against the gold answer's "
            "'#### 72', \\boxed{72} or plain 72."
        ),
    )
    custom: dict[str, str] = field(
        default_factory=dict,
        metadata=doc(
            "Extra verifiers to register: name -> 'package.module:function' (or 'package.module.function')."
        ),
    )
    accuracy_verifier: str = field(
        default="exact_match", metadata=doc("Verifier whose score >= 1 counts as a correct answer.")
    )
    models: dict[str, float] = field(
        default_factory=dict,
        metadata=doc(
            "Learned reward models: local HF directory -> weight. A sequence-classification model "
            "(num_labels 1) or a causal LM with a TRL value head; each scores prompt + response with "
            "its own tokenizer, and the weighted scores add to the verifiers'."
        ),
    )
    model_micro_batch: int = field(default=16, metadata=doc("Sequences per forward pass of a reward model."))
    overlong_buffer: int = field(
        default=0,
        metadata=doc(
            "DAPO overlong shaping: responses longer than (generation budget - overlong_buffer) tokens "
            "lose overlong_penalty x (excess / overlong_buffer) reward (up to overlong_penalty at the "
            "budget); 0 = off."
        ),
    )
    overlong_penalty: float = field(
        default=1.0,
        metadata=doc("Reward a response of the full budget loses (with overlong_buffer)."),
    )

    code: CodeRewardConfig = field(
        default_factory=CodeRewardConfig, metadata=doc("The code_tests verifier's sandbox (docs/sandbox.md).")
    )

    def __post_init__(self) -> None:
        check(
            bool(self.verifiers or self.models),
            "reward.verifiers",
            self.verifiers,
            "at least one verifier (or a reward model in reward.models)",
        )
        check(self.model_micro_batch >= 1, "reward.model_micro_batch", self.model_micro_batch, ">= 1")
        check(self.overlong_buffer >= 0, "reward.overlong_buffer", self.overlong_buffer, ">= 0 (0 = off)")
        check(self.overlong_penalty >= 0, "reward.overlong_penalty", self.overlong_penalty, ">= 0")
        for path, weight in self.models.items():
            check(bool(path), "reward.models", self.models, "local directory -> weight, no empty path")
            check(isinstance(weight, (int, float)), f"reward.models.{path}", weight, "a number")
