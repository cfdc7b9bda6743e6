"""An LLM judge on a local model: a rubric per row, greedy-decoded by a rollout engine, under a deadline.

`LocalJudge.judge` formats `reward.judge.template` with each row's prompt, response and gold answer,
answers repeats from its LRU cache (`data.judge_verdicts.JudgeCache`), and decodes the rest greedily
in `micro_batch` prompts a `generate` call on a daemon thread. The batch's deadline
(`reward.judge.timeout_s`) bounds the wait: rows not decoded by then are `timeout`, and the thread
is abandoned (a hung local `generate` cannot be interrupted: it keeps its thread, counted in
`reward/judge_abandoned`). At most one judge thread runs at a time: a batch that starts while an
abandoned one still runs waits for it within its own deadline, and is all `timeout` if it does not end.

The engine is the one the run's rollout would get for the judge's architecture (`engines.registry`:
the Llama-family KV-cache decoder, the embedded GPT-2 one, or HF `generate`; `engine.rollout: vllm`
falls back to these, the judge being a second model in the reward worker).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from entrepot.grpo.config import JudgeConfig
from entrepot.grpo.data.judge_verdicts import (
    JudgeCache,
    Judgement,
    JudgeVerdict,
    judge_key,
    judge_metrics,
    parse_judgement,
)
from entrepot.grpo.errors import RewardError

if TYPE_CHECKING:
    import torch

    from entrepot.grpo.config import GRPOConfig
    from entrepot.grpo.engines.base import RolloutEngine

__all__ = ["LocalJudge", "build_judge", "check_judge_dir"]


@dataclass
class _Job:
    """One batch's decoding on the judge thread: its outputs filled in per micro-batch."""

    prompts: list[list[int]]
    outputs: list[str | None]
    lock: threading.Lock = field(default_factory=threading.Lock)
    abandoned: bool = False
    error: BaseException | None = None


class LocalJudge:
    """Scores (prompt, response, answer) rows with a judge model (see the module docstring).

    Args:
        judge: the `reward.judge` section.
        tokenizer: the judge's tokenizer (its chat template, when it has one, wraps each rubric).
        engine: a rollout engine holding the judge's weights.
        max_positions: positions the judge can place (None: no limit); a longer rubric is `too_long`.
    """

    def __init__(
        self, judge: JudgeConfig, tokenizer: Any, engine: RolloutEngine, *, max_positions: int | None = None
    ) -> None:
        from entrepot.grpo.engines.base import SamplingParams

        self.config, self.tokenizer, self.engine = judge, tokenizer, engine
        self.max_positions = max_positions
        self.pattern = re.compile(judge.pattern)
        self.cache = JudgeCache(judge.cache_size)
        eos = tokenizer.eos_token_id
        self.params = SamplingParams(
            temperature=0.0,
            max_new_tokens=judge.max_tokens,
            stop_token_ids=(eos,) if eos is not None else (),
        )
        self.pad_token_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._running: threading.Thread | None = None  # the last judge thread (alive: abandoned)

    def judge(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> tuple[list[Judgement], dict[str, float]]:
        """One judgement per row, every one within `timeout_s` (+ parsing); and the batch's metrics
        (`data.judge_verdicts.judge_metrics`).

        Raises:
            RewardError: the judge's engine raised (a broken model, not a bad answer).
        """
        deadline = time.monotonic() + self.config.timeout_s
        texts = [
            self.config.template.format(prompt=p, response=r, answer=a)
            for p, r, a in zip(prompts, responses, answers, strict=True)
        ]
        keys = [judge_key(text) for text in texts]
        found: dict[bytes, Judgement] = {}
        hits = 0
        todo: dict[bytes, str] = {}  # distinct rubrics to decode, in row order
        for key, text in zip(keys, texts, strict=True):
            cached = found.get(key) or self.cache.get(key)
            if cached is not None or key in todo:  # a repeat within the batch is answered once too
                hits += 1
                if cached is not None:
                    found[key] = cached
                continue
            todo[key] = text
        decode: dict[bytes, list[int]] = {}
        for key, text in todo.items():
            ids = self._encode(text)
            if self.max_positions is not None and len(ids) + self.config.max_tokens > self.max_positions:
                found[key] = Judgement(JudgeVerdict.TOO_LONG, self.config.fail_score)
            else:
                decode[key] = ids
        outputs, abandoned = self._decode(list(decode.values()), deadline)
        for key, output in zip(decode, outputs, strict=True):
            if output is None:
                found[key] = Judgement(JudgeVerdict.TIMEOUT, self.config.fail_score)
            else:
                found[key] = parse_judgement(output, self.config, self.pattern)
        for key in todo:
            self.cache.put(key, found[key])
        judgements = [found[key] for key in keys]
        return judgements, judge_metrics(judgements, hits, abandoned)

    def _encode(self, text: str) -> list[int]:
        """The rubric's token ids: as a user turn of the judge's chat template, when it has one."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                          tokenize=True)  # fmt: skip
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return list(tok(text)["input_ids"])

    def _decode(self, prompts: list[list[int]], deadline: float) -> tuple[list[str | None], int]:
        """Each prompt's decoded output, None where the deadline passed first; threads abandoned (0 / 1)."""
        if not prompts:
            return [], 0
        previous = self._running
        if previous is not None and previous.is_alive():  # an abandoned batch still decodes
            previous.join(max(0.0, deadline - time.monotonic()))
            if previous.is_alive():
                return [None] * len(prompts), 0
        self._running = None
        job = _Job(prompts, [None] * len(prompts))
        thread = threading.Thread(target=self._run, args=(job,), name="judge", daemon=True)
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
        with job.lock:
            job.abandoned = thread.is_alive()
            outputs = list(job.outputs)
        if job.error is not None and not job.abandoned:
            raise RewardError(f"reward.judge: the judge's generate raised {type(job.error).__name__}: "
                              f"{job.error}") from job.error  # fmt: skip
        if job.abandoned:
            self._running = thread
        return outputs, int(job.abandoned)

    def _run(self, job: _Job) -> None:
        """The judge thread: micro-batches in order, each one's outputs published when it ends."""
        import torch

        micro = self.config.micro_batch
        try:
            with torch.no_grad():
                for start in range(0, len(job.prompts), micro):
                    with job.lock:
                        if job.abandoned:
                            return
                    batch = job.prompts[start : start + micro]
                    rollout = self.engine.generate(batch, self.params, pad_token_id=self.pad_token_id)
                    texts = [self._text(r) for r in rollout.responses()]
                    with job.lock:
                        job.outputs[start : start + len(texts)] = texts
        except BaseException as error:  # handed to the batch's caller (or dropped when abandoned)
            job.error = error

    def _text(self, tokens: torch.Tensor) -> str:
        return str(self.tokenizer.decode(tokens.tolist(), skip_special_tokens=True))


def build_judge(config: GRPOConfig, policy_tokenizer: Any | None = None) -> LocalJudge:
    """The run's judge on `engine.device`: `reward.judge.model_path` with its own tokenizer, or the
    reference's weights with `policy_tokenizer` (`reward.judge.use_reference`).

    Raises:
        DataError: the judge's directory is not a loadable HF causal LM (naming the key).
    """
    import torch

    from entrepot.grpo.engines.models import load_pretrained
    from entrepot.grpo.engines.registry import ROLLOUT_ENGINES

    judge = config.reward.judge
    if judge.model_path is not None:
        model, tokenizer = load_pretrained(judge.model_path, key="reward.judge.model_path")
    else:
        path = config.model.ref_model_load_path or config.model.path
        assert path is not None and policy_tokenizer is not None  # checks.check_judge
        model, _ = load_pretrained(path, with_tokenizer=False, key="reward.judge.use_reference")
        tokenizer = policy_tokenizer
    model = model.to(config.engine.device).requires_grad_(False).eval()
    spec = ROLLOUT_ENGINES["hf" if config.engine.rollout == "hf" else "torch"]
    with torch.no_grad():
        engine, target = spec.build(config, model, None, True, 1)
        _load_into(engine, target, model)
    positions = getattr(engine, "max_positions", None) if hasattr(engine, "max_positions") else (
        getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
    )  # fmt: skip
    return LocalJudge(judge, tokenizer, engine, max_positions=positions)


def _load_into(engine: Any, target: str, model: torch.nn.Module) -> None:
    """The judge's weights into the engine's layout (nothing when it reads the module's own)."""
    from entrepot.grpo.embedded.gpt2_model import hf_architecture
    from entrepot.grpo.engines.shared_weights import POLICY_TARGET
    from entrepot.resharding import LocalResharder
    from entrepot.resharding.adaptors import get_adaptor
    from entrepot.resharding.engines.torch import TorchTrainingEngine

    if target == POLICY_TARGET:
        return
    adaptor = get_adaptor(hf_architecture(model), model.config)
    engine.load_weights(
        LocalResharder(adaptor, target).reshard(TorchTrainingEngine(model, adaptor).named_train_parameters())
    )


def check_judge_dir(path: str) -> None:
    """Cheap check (config and tokenizer; no weights) for preflight: an HF causal LM with a tokenizer.

    Raises:
        DataError: naming ``reward.judge.model_path``: no config.json, a config or tokenizer that does not
            load, or a model that is not a causal LM.
    """
    from pathlib import Path

    from entrepot.grpo.engines.models import load_model_config, read_tokenizer
    from entrepot.grpo.errors import DataError

    key = "reward.judge.model_path"
    config = load_model_config(path, key)
    architecture = (config.architectures or ["(none)"])[0]
    if not architecture.endswith(("ForCausalLM", "LMHeadModel")):
        raise DataError(f"{key} ({path!r}) holds a {architecture}; expected a causal LM (*ForCausalLM) that "
                        "writes its verdict")  # fmt: skip
    read_tokenizer(Path(path), lambda what: DataError(f"{key} ({path!r}): {what}"))
