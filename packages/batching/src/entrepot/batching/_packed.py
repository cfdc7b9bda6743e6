"""Remove padding for forward/training: ``PackedBatch`` and the scatter back to padded/per-sequence.

Legend: B sequences, L padded width, n_i real tokens of sequence i, a_i = n_i rounded up to
``align_to`` (the per-sequence TP x CP alignment, as MindSpeed-RL does for context parallelism),
T = sum(a_i) packed tokens, F trailing feature dims (e.g. [V] for logits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from entrepot.batching._errors import InvalidArgumentError, LengthMismatchError
from entrepot.batching._lengths import as_length_list
from entrepot.batching._padding import PadValue, _check_sequences, pack

__all__ = ["PackedBatch"]


def _check_align(align_to: int) -> None:
    if isinstance(align_to, bool) or not isinstance(align_to, int) or align_to < 1:
        raise InvalidArgumentError(f"align_to must be an int >= 1 (e.g. tp * cp), got {align_to!r}")


@dataclass(frozen=True, eq=False)
class PackedBatch:
    """B sequences laid end to end in one row, ready for a varlen attention kernel.

    Attributes:
        input_ids: [1, T] packed tokens; alignment slots hold ``pad_value``.
        position_ids: [1, T] restarting at 0 in every sequence (alignment slots continue counting).
        cu_seqlens: int32 [B + 1] cumulative aligned lengths, ``cu_seqlens[0] == 0``.
        max_seqlen: the longest aligned length a_i (0 for an empty batch).
        lengths: int64 [B] real lengths n_i (without alignment slots).
        valid_mask: bool [B, L]: where the real tokens sit in the padded layout this batch maps to.
        real_index: int64 [sum(n_i)] packed positions of the real tokens, or None when there are no
            alignment slots (every packed position is real).
    """

    input_ids: Tensor
    position_ids: Tensor
    cu_seqlens: Tensor
    max_seqlen: int
    lengths: Tensor
    valid_mask: Tensor
    real_index: Tensor | None

    @property
    def num_sequences(self) -> int:
        """B."""
        return int(self.lengths.shape[0])

    @property
    def num_tokens(self) -> int:
        """T, alignment slots included."""
        return int(self.input_ids.shape[1])

    @classmethod
    def from_padded(
        cls,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        align_to: int = 1,
        *,
        lengths: Tensor | Sequence[int] | None = None,
        pad_value: PadValue = 0,
    ) -> PackedBatch:
        """Pack a padded batch, keeping the tokens where ``attention_mask`` is nonzero.

        The mask may pad on either side or both (left-padded prompt + right-padded response):
        the kept tokens of each row are concatenated in order.

        Args:
            input_ids: [B, L].
            attention_mask: [B, L], nonzero = real token. Give this or ``lengths``.
            align_to: round each sequence up to a multiple of this (``tp * cp``).
            lengths: B real lengths of a right-padded batch, instead of a mask.
            pad_value: token written into alignment slots.
        """
        _check_align(align_to)
        if input_ids.dim() != 2:
            raise InvalidArgumentError(f"input_ids must have shape [B, L], got {tuple(input_ids.shape)}")
        if (attention_mask is None) == (lengths is None):
            raise InvalidArgumentError("give exactly one of attention_mask or lengths")
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise LengthMismatchError(
                    f"attention_mask has shape {tuple(attention_mask.shape)}, "
                    f"input_ids {tuple(input_ids.shape)}; they must be equal"
                )
            mask = attention_mask.to(device=input_ids.device, dtype=torch.bool)
        else:
            assert lengths is not None  # checked above: exactly one was given
            mask = _right_padded_mask(lengths, input_ids.shape[0], input_ids.shape[1], input_ids.device)
        return cls._build(input_ids[mask], mask, align_to, pad_value)

    @classmethod
    def from_sequences(
        cls, sequences: Sequence[Tensor], align_to: int = 1, *, pad_value: PadValue = 0
    ) -> PackedBatch:
        """Pack B token tensors of shape [n_i]; ``to_padded`` then gives a right-padded [B, max n_i]."""
        _check_align(align_to)
        _check_sequences(sequences)
        if any(seq.dim() != 1 for seq in sequences):
            raise InvalidArgumentError("from_sequences takes 1-D token tensors")
        flat, seq_lengths = pack(sequences)
        device = flat.device
        width = int(seq_lengths.max()) if len(sequences) else 0
        mask = _right_padded_mask(seq_lengths, len(sequences), width, device)
        return cls._build(flat.to(torch.int64) if not sequences else flat, mask, align_to, pad_value)

    @classmethod
    def _build(cls, real_tokens: Tensor, mask: Tensor, align_to: int, pad_value: PadValue) -> PackedBatch:
        device = real_tokens.device
        lengths = mask.sum(dim=1, dtype=torch.int64)  # [B]
        aligned = (lengths + align_to - 1) // align_to * align_to  # [B]
        cu_seqlens = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64, device=device)
        torch.cumsum(aligned, dim=0, out=cu_seqlens[1:])
        total = int(cu_seqlens[-1])
        starts = torch.repeat_interleave(cu_seqlens[:-1], aligned)  # [T]
        position_ids = torch.arange(total, device=device) - starts  # [T]
        if align_to == 1:
            input_ids, real_index = real_tokens, None
        else:
            real_cu = torch.cumsum(lengths, dim=0) - lengths  # [B] first real slot of each sequence
            shift = torch.repeat_interleave(cu_seqlens[:-1] - real_cu, lengths)  # [sum(n_i)]
            real_index = torch.arange(real_tokens.shape[0], device=device) + shift
            input_ids = real_tokens.new_full((total,), pad_value)
            input_ids[real_index] = real_tokens
        return cls(
            input_ids=input_ids.unsqueeze(0),
            position_ids=position_ids.unsqueeze(0),
            cu_seqlens=cu_seqlens.to(torch.int32),
            max_seqlen=int(aligned.max()) if aligned.numel() else 0,
            lengths=lengths,
            valid_mask=mask,
            real_index=real_index,
        )

    def _flat(self, per_token: Tensor) -> Tensor:
        """Accept [1, T, *F] or [T, *F]; return [T, *F]."""
        if per_token.dim() >= 2 and per_token.shape[0] == 1 and per_token.shape[1] == self.num_tokens:
            per_token = per_token[0]
        if per_token.dim() == 0 or per_token.shape[0] != self.num_tokens:
            raise LengthMismatchError(
                f"per-token tensor has shape {tuple(per_token.shape)}; expected [1, {self.num_tokens}, ...] "
                f"or [{self.num_tokens}, ...] for this packed batch"
            )
        return per_token

    def _real(self, per_token: Tensor) -> Tensor:
        flat = self._flat(per_token)
        return flat if self.real_index is None else flat[self.real_index]

    def pack_padded(self, values: Tensor, pad_value: PadValue = 0) -> Tensor:
        """Pack another padded per-token tensor (labels, old log-probs, masks) in this batch's layout.

        Args:
            values: [B, L, *F] aligned with the tensor this batch was built from.

        Returns:
            [1, T, *F].
        """
        if values.shape[:2] != self.valid_mask.shape:
            raise LengthMismatchError(
                f"values have leading shape {tuple(values.shape[:2])}, "
                f"this batch maps to {tuple(self.valid_mask.shape)}"
            )
        real = values[self.valid_mask]  # [sum(n_i), *F]
        if self.real_index is None:
            return real.unsqueeze(0)
        out = real.new_full((self.num_tokens, *real.shape[1:]), pad_value)
        out[self.real_index] = real
        return out.unsqueeze(0)

    def to_padded(self, per_token: Tensor, fill_value: PadValue = 0) -> Tensor:
        """Scatter per-token outputs (logits, log-probs, entropies) back to the padded layout.

        Args:
            per_token: [1, T, *F] or [T, *F].
            fill_value: written where the padded layout has no real token.

        Returns:
            [B, L, *F] with real tokens where they came from.
        """
        real = self._real(per_token)
        out = real.new_full((*self.valid_mask.shape, *real.shape[1:]), fill_value)
        out[self.valid_mask] = real
        return out

    def to_list(self, per_token: Tensor) -> list[Tensor]:
        """Per-sequence views [n_i, *F] of per-token outputs (alignment slots dropped)."""
        flat = self._flat(per_token)
        aligned = (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()
        real = self.lengths.tolist()
        return [part[:n] for part, n in zip(torch.split(flat, aligned), real, strict=True)]

    def next_token_labels(self, ignore_index: int = -100) -> Tensor:
        """Labels [1, T]: the next token of the same sequence, ``ignore_index`` at each sequence end.

        Positions whose next slot is alignment padding also get ``ignore_index``.
        """
        ids = self.input_ids[0]
        labels = torch.roll(ids, shifts=-1).clone()
        next_is_real = torch.zeros(self.num_tokens, dtype=torch.bool, device=ids.device)
        if self.real_index is None:
            next_is_real[:] = True
        else:
            next_is_real[self.real_index] = True
        next_is_real = torch.roll(next_is_real, shifts=-1)
        seq_ends = self.cu_seqlens[1:].to(torch.int64) - 1
        next_is_real[seq_ends[seq_ends >= 0]] = False
        labels[~next_is_real] = ignore_index
        return labels.unsqueeze(0)


def _right_padded_mask(
    lengths: Tensor | Sequence[int], batch: int, width: int, device: torch.device
) -> Tensor:
    sizes = as_length_list(lengths)
    if len(sizes) != batch:
        raise LengthMismatchError(f"{len(sizes)} lengths for {batch} rows; they must match")
    if sizes and max(sizes) > width:
        index = max(range(len(sizes)), key=sizes.__getitem__)
        raise LengthMismatchError(f"lengths[{index}] = {sizes[index]} exceeds the padded width L = {width}")
    size_tensor = torch.tensor(sizes, dtype=torch.int64, device=device)
    return torch.arange(width, device=device).unsqueeze(0) < size_tensor.unsqueeze(1)  # [B, L]
