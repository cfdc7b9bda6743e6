"""Learned reward models: a local HF directory that gives each prompt + response text one score.

Two layouts load into the same shape, a backbone (the decoder without its LM head) plus a
Linear(hidden, 1) head:

| kind         | the directory holds                                         | the head                |
|--------------|-------------------------------------------------------------|-------------------------|
| `classifier` | an HF `*ForSequenceClassification` with `num_labels=1`      | the model's `score`     |
| `value_head` | a causal LM whose safetensors also hold TRL's value head:   | a Linear built from     |
|              | `v_head.summary.weight` [1, H], `v_head.summary.bias` [1]   | those tensors           |
|              | (the bias optional), sharded (index.json) or not            |                         |

Both score a text the same way, so the two are interchangeable and checkable against HF: the head
applied to the backbone's last hidden state (final norm included) at the text's last real token, which
is what HF's sequence classifiers and TRL's value head compute. Texts are tokenized with the reward
model's own tokenizer, never the policy's; a text longer than the model's positions is an error,
never truncated.

Shapes: B texts, L tokens (the longest text of a micro-batch), H the hidden size.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from entrepot.grpo.errors import RewardModelError

__all__ = ["RewardModel", "check_reward_model_dir", "load_reward_model", "reward_model_kind"]

_VALUE_WEIGHT = "v_head.summary.weight"
_VALUE_BIAS = "v_head.summary.bias"
_SAFETENSORS = "model.safetensors"
_SAFETENSORS_INDEX = "model.safetensors.index.json"


class RewardModel:
    """A backbone and a Linear(hidden, 1) head that score prompt + response texts (see the module doc).

    Attributes:
        path: the directory it was loaded from.
        kind: ``"classifier"`` or ``"value_head"``.
        tokenizer: the reward model's own tokenizer (pad = EOS when it has none).
    """

    def __init__(
        self,
        path: str,
        kind: str,
        tokenizer: Any,
        backbone: torch.nn.Module,
        head: torch.nn.Linear,
        max_positions: int | None,
    ) -> None:
        self.path, self.kind, self.tokenizer = path, kind, tokenizer
        self._backbone, self._head, self._max_positions = backbone.eval(), head.eval(), max_positions

    def parameters(self) -> list[torch.Tensor]:
        """Every parameter, backbone then head (what an offloader moves between devices)."""
        return [*self._backbone.parameters(), *self._head.parameters()]

    def to(self, device: str | torch.device) -> RewardModel:
        """Move the backbone and the head to `device`; returns self."""
        self._backbone.to(device)
        self._head.to(device)
        return self

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], *, micro_batch: int = 16
    ) -> torch.Tensor:
        """One score per text ``prompts[i] + responses[i]``: the head at its last real token.

        Args:
            prompts: B prompt texts.
            responses: B response texts, appended to their prompt as they are (no separator).
            micro_batch: at most this many texts go through the backbone at once.

        Returns:
            Float32 scores [B] on the CPU.

        Raises:
            RewardModelError: a text has no tokens or more than the model's positions (naming its row).
        """
        if len(prompts) != len(responses) or micro_batch < 1:
            raise RewardModelError(
                f"reward model {self.path!r}: got {len(prompts)} prompts, {len(responses)} responses and "
                f"micro_batch={micro_batch}; expected one response per prompt and micro_batch >= 1"
            )
        if not prompts:
            return torch.zeros(0)
        texts = [prompt + response for prompt, response in zip(prompts, responses, strict=True)]
        token_ids: list[list[int]] = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        for row, ids in enumerate(token_ids):  # every text checked before any runs
            self._check_length(row, len(ids))
        # longest first, so a micro-batch pads to texts of similar length
        order = sorted(range(len(token_ids)), key=lambda row: -len(token_ids[row]))
        scores = torch.empty(len(token_ids), dtype=torch.float32)
        with torch.no_grad():
            for start in range(0, len(order), micro_batch):
                rows = order[start : start + micro_batch]
                scores[rows] = self._score_batch([token_ids[row] for row in rows])
        return scores

    def _check_length(self, row: int, num_tokens: int) -> None:
        if num_tokens == 0:
            raise RewardModelError(
                f"reward model {self.path!r}: row {row} of this call (prompt + response) has no tokens; "
                "expected at least one"
            )
        if self._max_positions is not None and num_tokens > self._max_positions:
            raise RewardModelError(
                f"reward model {self.path!r}: row {row} of this call (prompt + response) has {num_tokens} "
                f"tokens; expected at most the model's {self._max_positions} positions (texts are not "
                "truncated)"
            )

    def _score_batch(self, token_ids: list[list[int]]) -> torch.Tensor:
        """Scores [b] of a micro-batch of non-empty token lists, run right-padded with a mask."""
        lengths = torch.tensor([len(ids) for ids in token_ids])  # [b]
        pad_id = self.tokenizer.pad_token_id  # it only fills masked positions, never read
        input_ids = torch.full(
            (len(token_ids), int(lengths.max())), 0 if pad_id is None else pad_id
        )  # [b, L]
        for i, ids in enumerate(token_ids):
            input_ids[i, : len(ids)] = torch.tensor(ids)
        attention_mask = (torch.arange(input_ids.shape[1]) < lengths[:, None]).long()  # [b, L]
        device = self._head.weight.device
        outputs = self._backbone(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
        )
        hidden = outputs.last_hidden_state  # [b, L, H] (the final norm applied; no per-layer copies kept)
        last = hidden[torch.arange(len(token_ids), device=device), lengths.to(device) - 1]  # [b, H]
        return self._head(last).squeeze(-1).float().cpu()  # [b]


def load_reward_model(path: str | Path, device: str = "cpu") -> RewardModel:
    """Load a reward model from a local HF directory (never from the hub), in eval mode on `device`.

    Raises:
        RewardModelError: the directory is not a reward model of either kind (the message says why).
    """
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    directory = Path(path)
    config = _load_config(directory)
    kind, value_head_files = _reward_kind(directory, config)
    tokenizer = _load_tokenizer(directory)
    if kind == "classifier":
        model = _load_weights(directory, AutoModelForSequenceClassification)
        head = getattr(model, "score", None)
        if not isinstance(head, torch.nn.Linear):
            raise RewardModelError(
                f"reward model {str(directory)!r}: its {type(model).__name__} has no `score` Linear head; "
                "expected a decoder sequence classifier (GPT-2, Llama, Qwen2, ...)"
            )
    else:
        model = _load_weights(directory, AutoModelForCausalLM)
        head = _value_head(value_head_files, config.hidden_size)
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    # the backbone alone: a causal LM's vocabulary-sized LM head is never used for a score
    return RewardModel(str(directory), kind, tokenizer, model.base_model, head, max_positions).to(device)


def reward_model_kind(path: str | Path) -> str:
    """``"classifier"`` or ``"value_head"`` from the config and the safetensors' key names (no tensors).

    Raises:
        RewardModelError: the directory is not a reward model of either kind (the message says why).
    """
    directory = Path(path)
    kind, _ = _reward_kind(directory, _load_config(directory))
    return kind


def check_reward_model_dir(path: str | Path) -> str:
    """Cheap check (config, weight names and tokenizer; no weights loaded) for preflight; returns the kind.

    Raises:
        RewardModelError: the directory is not a reward model of either kind (the message says why).
    """
    kind = reward_model_kind(path)
    _load_tokenizer(Path(path))
    return kind


def _load_config(directory: Path) -> Any:
    from transformers import AutoConfig

    if not (directory / "config.json").is_file():
        raise RewardModelError(
            f"reward model {str(directory)!r} has no config.json; expected a local HF model directory "
            "(config.json, tokenizer files, safetensors weights)"
        )
    try:
        return AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise _load_failed(directory, "config.json", exc) from None


def _load_failed(directory: Path, what: str, exc: Exception) -> RewardModelError:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    return RewardModelError(f"reward model {str(directory)!r}: its {what} does not load: {reason}")


def _reward_kind(directory: Path, config: Any) -> tuple[str, dict[str, Path]]:
    """The kind of reward model `directory` holds and, for a value head, the file of each v_head tensor."""
    architecture = (config.architectures or [None])[0]
    if architecture is not None and architecture.endswith("ForSequenceClassification"):
        if config.num_labels != 1:
            raise RewardModelError(
                f"reward model {str(directory)!r}: its {architecture} has num_labels={config.num_labels}; "
                "expected num_labels=1 (one score per text)"
            )
        return "classifier", {}
    files = _value_head_files(directory)
    if _VALUE_WEIGHT not in files:
        raise RewardModelError(
            f"reward model {str(directory)!r}: its {architecture} is not a *ForSequenceClassification and "
            f"its {_SAFETENSORS} (or {_SAFETENSORS_INDEX}) holds no {_VALUE_WEIGHT}; expected a sequence "
            f"classifier with num_labels=1, or a causal LM with TRL's value head ({_VALUE_WEIGHT} "
            f"[1, hidden] and optionally {_VALUE_BIAS} [1])"
        )
    from safetensors import safe_open

    expected = {_VALUE_WEIGHT: [1, config.hidden_size], _VALUE_BIAS: [1]}
    for key, file in files.items():
        with safe_open(file, framework="pt") as tensors:
            shape = list(tensors.get_slice(key).get_shape())
        if shape != expected[key]:
            raise RewardModelError(
                f"reward model {str(directory)!r}: {key} in {file.name} has shape {shape}; expected "
                f"{expected[key]} (hidden_size {config.hidden_size})"
            )
    return "value_head", files


def _value_head_files(directory: Path) -> dict[str, Path]:
    """The safetensors file of each v_head tensor in `directory`, sharded (index.json) or not."""
    index = directory / _SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {key: directory / weight_map[key] for key in (_VALUE_WEIGHT, _VALUE_BIAS) if key in weight_map}
    single = directory / _SAFETENSORS
    if not single.is_file():
        return {}
    from safetensors import safe_open

    with safe_open(single, framework="pt") as tensors:
        keys = set(tensors.keys())
    return {key: single for key in (_VALUE_WEIGHT, _VALUE_BIAS) if key in keys}


def _value_head(files: dict[str, Path], hidden_size: int) -> torch.nn.Linear:
    """TRL's value head as a float32 Linear(H, 1), from the v_head tensors (shapes already checked)."""
    from safetensors import safe_open

    head = torch.nn.Linear(hidden_size, 1, bias=_VALUE_BIAS in files)
    with torch.no_grad():
        for key, param in ((_VALUE_WEIGHT, head.weight), (_VALUE_BIAS, head.bias)):
            if key in files:
                with safe_open(files[key], framework="pt") as tensors:
                    param.copy_(tensors.get_tensor(key))
    return head


def _load_tokenizer(directory: Path) -> Any:
    from entrepot.grpo.engines.models import read_tokenizer

    prefix = f"reward model {str(directory)!r}"
    return read_tokenizer(directory, lambda what: RewardModelError(f"{prefix}: {what}"))


def _load_weights(directory: Path, auto_class: Any) -> Any:
    """The float32 model of `directory` through a transformers auto class (local files only).

    A value-head directory's v_head tensors are keys the causal LM does not expect: transformers'
    load report that lists them is dropped, and the keys it would report missing (weights left at
    random) are an error instead.
    """
    logger = logging.getLogger("transformers.modeling_utils")
    logger.addFilter(_not_load_report)
    try:
        model, info = auto_class.from_pretrained(
            directory, local_files_only=True, dtype=torch.float32, output_loading_info=True
        )
    except (OSError, ValueError, RuntimeError) as exc:
        raise _load_failed(directory, "weights", exc) from None
    finally:
        logger.removeFilter(_not_load_report)
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise RewardModelError(
            f"reward model {str(directory)!r}: its weights lack {len(missing)} tensors of its "
            f"{type(model).__name__} ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}); "
            "expected every weight of the model in its safetensors"
        )
    return model


def _not_load_report(record: logging.LogRecord) -> bool:
    return "LOAD REPORT" not in record.getMessage()
