"""How responses are scored: the `reward` section (rule verifiers, learned reward models, an LLM judge)."""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

from entrepot.grpo.config.fields import check, doc
from entrepot.grpo.errors import GRPOConfigError

__all__ = ["CODE_VERDICTS", "JUDGE_VERDICTS", "CodeRewardConfig", "JudgeConfig", "RewardConfig"]

# the sandbox's verdicts (entrepot.grpo.sandbox.Verdict; config imports no other wing)
CODE_VERDICTS = ("pass", "fail", "timeout", "crash", "memory", "syntax")
# the judge's verdicts (entrepot.grpo.data.judge_verdicts.JudgeVerdict)
JUDGE_VERDICTS = ("ok", "unparseable", "out_of_range", "timeout", "too_long")
JUDGE_FIELDS = ("prompt", "response", "answer")

DEFAULT_JUDGE_TEMPLATE = (
    "You are grading a response to a task. Rate how correct and helpful the response is on a scale "
    "from 0 (wrong or useless) to 10 (fully correct).\n\n"
    "Task:\n{prompt}\n\nReference answer:\n{answer}\n\nResponse:\n{response}\n\n"
    'Reply with one line of the form "Score: N".'
)


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
class JudgeConfig:
    """An LLM judge (docs/judge.md): a local model reads a rubric with the prompt and the response and
    answers "Score: N"; the number, mapped to [0, 1] by `scale`, adds `weight` x it to the reward."""

    model_path: str | None = field(
        default=None, metadata=doc("The judge: a local HF model directory (config.json, tokenizer, weights).")
    )
    use_reference: bool = field(
        default=False,
        metadata=doc(
            "Judge with the run's reference model (model.ref_model_load_path, else the initial policy of "
            "model.path) and the policy's tokenizer, in place of model_path; needs algorithm.kl_coef > 0."
        ),
    )
    weight: float = field(
        default=1.0, metadata=doc("Weight of the judge's [0, 1] score in the reward's sum.")
    )
    template: str = field(
        default=DEFAULT_JUDGE_TEMPLATE,
        metadata=doc(
            "The judge's prompt: a str.format template with {response} and optionally {prompt}, {answer} "
            "(the row's prompt text, response text and gold answer); the judge's chat template is applied."
        ),
    )
    pattern: str = field(
        default=r"Score:\s*(-?\d+(?:\.\d+)?)",
        metadata=doc("Regex with one group, the number, searched in the judge's output (the first match)."),
    )
    scale: tuple[float, float] = field(
        default=(0.0, 10.0), metadata=doc("(min, max) of the judge's scale: min maps to 0, max to 1.")
    )
    max_tokens: int = field(
        default=16,
        metadata=doc("Tokens the judge may write (greedy decoding; rollout.max_new_tokens is the policy's)."),
    )
    micro_batch: int = field(default=64, metadata=doc("Judge prompts per generate call."))
    timeout_s: float = field(
        default=120.0,
        metadata=doc(
            "Deadline of one reward batch's judging; rows not judged by then get verdict timeout and "
            "fail_score (the step goes on; a hung generate keeps its thread)."
        ),
    )
    fail_score: float = field(
        default=0.0, metadata=doc("The [0, 1] score of a row without a score (any verdict but ok).")
    )
    cache_size: int = field(
        default=4096,
        metadata=doc("(prompt, response, answer) verdicts kept, least recently used out; 0 = off."),
    )

    @property
    def enabled(self) -> bool:
        """Whether a judge scores the responses."""
        return self.model_path is not None or self.use_reference

    def __post_init__(self) -> None:
        key = "reward.judge"
        check(not (self.model_path is not None and self.use_reference), f"{key}.use_reference",
              self.use_reference, "false with reward.judge.model_path set (one judge)")  # fmt: skip
        if self.model_path is not None:
            check(bool(self.model_path), f"{key}.model_path", self.model_path, "a local directory")
        check(isinstance(self.weight, (int, float)) and self.weight == self.weight, f"{key}.weight",
              self.weight, "a number")  # fmt: skip
        check(self.max_tokens >= 1, f"{key}.max_tokens", self.max_tokens, ">= 1")
        check(self.micro_batch >= 1, f"{key}.micro_batch", self.micro_batch, ">= 1")
        check(self.timeout_s > 0, f"{key}.timeout_s", self.timeout_s, "> 0 seconds")
        check(self.cache_size >= 0, f"{key}.cache_size", self.cache_size, ">= 0 (0 = off)")
        low, high = self.scale
        check(low < high, f"{key}.scale", list(self.scale), "(min, max) with min < max")
        check(self.fail_score == self.fail_score, f"{key}.fail_score", self.fail_score, "a number")
        _check_template(self.template)
        try:
            groups = re.compile(self.pattern).groups
        except re.error as error:
            raise GRPOConfigError(f"{key}.pattern ({self.pattern!r}) does not compile: {error}") from None
        check(
            groups == 1,
            f"{key}.pattern",
            self.pattern,
            f"a regex with one group, the number (it has {groups})",
        )


def _check_template(template: str) -> None:
    """The template formats with {prompt}, {response} and {answer} only, and has {response}."""
    key = "reward.judge.template"
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        raise GRPOConfigError(
            f"{key} is not a str.format template: {error} (write a literal brace as {{{{ or }}}})"
        ) from None
    unknown = sorted(names - set(JUDGE_FIELDS))
    check(
        not unknown, key, unknown, "fields among {prompt}, {response}, {answer} (a literal brace: {{ or }})"
    )
    check("response" in names, key, template[:60] + "...", "a template with {response}")


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
    judge: JudgeConfig = field(
        default_factory=JudgeConfig, metadata=doc("An LLM judge's score in the reward (docs/judge.md).")
    )

    def __post_init__(self) -> None:
        check(
            bool(self.verifiers or self.models or self.judge.enabled),
            "reward.verifiers",
            self.verifiers,
            "at least one verifier (or a reward model in reward.models, or reward.judge)",
        )
        check(self.model_micro_batch >= 1, "reward.model_micro_batch", self.model_micro_batch, ">= 1")
        check(self.overlong_buffer >= 0, "reward.overlong_buffer", self.overlong_buffer, ">= 0 (0 = off)")
        check(self.overlong_penalty >= 0, "reward.overlong_penalty", self.overlong_penalty, ">= 0")
        for path, weight in self.models.items():
            check(bool(path), "reward.models", self.models, "local directory -> weight, no empty path")
            check(isinstance(weight, (int, float)), f"reward.models.{path}", weight, "a number")
