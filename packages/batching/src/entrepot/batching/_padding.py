"""Pad / unpad / pack / unpack: the conversions every hop between the dock and the workers makes.

Layouts (legend: B sequences, n_i tokens in sequence i, T = sum(n_i), L padded width, F trailing
feature dims shared by all sequences, e.g. none for token ids, [V] for logits):

- a list of sequences: B tensors of shape [n_i, *F];
- padded: one tensor [B, L, *F] (right padding) plus int64 ``lengths`` [B];
- packed: one tensor [T, *F] (sequences end to end) plus int64 ``lengths`` [B].

Every conversion is one torch call over the data (``cat``, ``split``, ``pad_sequence``) plus an
O(B) loop over sequences for views; nothing loops over tokens in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from entrepot.batching._errors import InvalidArgumentError, LengthMismatchError
from entrepot.batching._lengths import as_length_list, round_up

__all__ = ["pack", "pad", "unpack", "unpad"]

PadValue = int | float | bool


def _check_sequences(sequences: Sequence[Tensor], name: str = "sequences") -> None:
    """Every item is a tensor of rank >= 1 with the first item's dtype, device and trailing shape."""
    if not sequences:
        return
    first = sequences[0]
    for index, seq in enumerate(sequences):
        if not isinstance(seq, Tensor):
            raise InvalidArgumentError(f"{name}[{index}] is a {type(seq).__name__}, expected a torch.Tensor")
        if seq.dim() == 0:
            raise InvalidArgumentError(f"{name}[{index}] is a 0-d tensor; sequences need a length dim")
        if seq.dtype != first.dtype or seq.device != first.device or seq.shape[1:] != first.shape[1:]:
            raise InvalidArgumentError(
                f"{name}[{index}] has dtype {seq.dtype}, device {seq.device}, trailing shape "
                f"{tuple(seq.shape[1:])}; {name}[0] has {first.dtype}, {first.device}, "
                f"{tuple(first.shape[1:])} (all must match)"
            )


def _check_multiple(multiple: int) -> None:
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        raise InvalidArgumentError(f"multiple must be an int >= 1, got {multiple!r}")


def _fast_lengths(sequences: Sequence[Tensor], name: str = "sequences") -> list[int]:
    """Lengths of the sequences, with C-level ``map`` calls instead of a per-item Python loop.

    For thousands of short sequences a per-item loop costs as much as the copy itself, so only
    the dtype is checked here (``torch.cat`` would silently promote a mixed batch); rank, trailing
    shape and device mismatches make the torch join fail, and :func:`_joined` then names the
    offending sequence.
    """
    if not sequences:
        return []
    try:
        if len(set(map(attrgetter("dtype"), sequences))) > 1:
            _check_sequences(sequences, name)
        if sequences[0].dim() == 1:
            return list(map(Tensor.numel, sequences))
        return [seq.shape[0] for seq in sequences]
    except (TypeError, AttributeError, IndexError):
        _check_sequences(sequences, name)
        raise


def _joined(join: Callable[[], Tensor], sequences: Sequence[Tensor]) -> Tensor:
    """Run a torch join (cat / pad_sequence); on a shape or device mismatch name the sequence."""
    try:
        return join()
    except RuntimeError:
        _check_sequences(sequences)
        raise


def pack(sequences: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Concatenate sequences end to end (one ``torch.cat``).

    Args:
        sequences: B tensors of shape [n_i, *F] with one dtype, device and F.

    Returns:
        ``(flat, lengths)``: flat [T, *F] and int64 lengths [B] on the CPU. An empty list gives an
        empty float32 ``flat`` of shape [0] and empty lengths.
    """
    sizes = _fast_lengths(sequences)
    lengths = torch.tensor(sizes, dtype=torch.int64)
    if not sequences:
        return torch.empty(0), lengths
    return _joined(lambda: torch.cat(list(sequences)), sequences), lengths


def unpack(flat: Tensor, lengths: Sequence[int] | Tensor) -> list[Tensor]:
    """Split a packed tensor back into sequences; the results are views of ``flat`` (no copy).

    Args:
        flat: [T, *F].
        lengths: B non-negative ints summing to T.

    Returns:
        B views of shape [n_i, *F].
    """
    sizes = as_length_list(lengths)
    if flat.dim() == 0:
        raise InvalidArgumentError("flat is a 0-d tensor; a packed tensor has shape [T, *F]")
    total = sum(sizes)
    if total != flat.shape[0]:
        raise LengthMismatchError(
            f"lengths sum to {total} but flat has {flat.shape[0]} rows along dim 0; they must be equal"
        )
    return list(torch.split(flat, sizes))


def _is_packed_pair(data: object) -> bool:
    return (
        isinstance(data, tuple)
        and len(data) == 2
        and isinstance(data[0], Tensor)
        and isinstance(data[1], Tensor)
        and data[1].dim() == 1
        and not data[1].is_floating_point()
    )


def pad(
    sequences: Sequence[Tensor] | tuple[Tensor, Tensor],
    pad_value: PadValue = 0,
    multiple: int = 1,
) -> tuple[Tensor, Tensor]:
    """Right-pad sequences into one [B, L, *F] tensor, L rounded up to ``multiple``.

    Args:
        sequences: a list of B tensors [n_i, *F], or a packed pair ``(flat, lengths)`` as returned
            by :func:`pack` (a ``tuple`` of two tensors whose second is a 1-D integer tensor is read
            as a packed pair; pass a ``list`` to pad two sequences).
        pad_value: fill value of the padding positions.
        multiple: L is the longest length rounded up to a multiple of this (e.g. ``tp * cp``).

    Returns:
        ``(padded, lengths)``: padded [B, L, *F] and int64 lengths [B] (CPU).
    """
    _check_multiple(multiple)
    if _is_packed_pair(sequences):
        flat, packed_lengths = sequences
        seqs: Sequence[Tensor] = unpack(flat, packed_lengths)
        template: Tensor | None = flat
    else:
        seqs = sequences
        template = seqs[0] if seqs else None
    sizes = _fast_lengths(seqs)
    lengths = torch.tensor(sizes, dtype=torch.int64)
    if template is None:
        return torch.empty(0, 0), lengths
    longest = max(sizes, default=0)
    width = round_up(longest, multiple)
    if not seqs:
        return template.new_empty((0, width, *template.shape[1:])), lengths
    if width == longest:
        padded = _joined(lambda: pad_sequence(list(seqs), batch_first=True, padding_value=pad_value), seqs)
        return padded, lengths
    # copy_ would broadcast a mismatched trailing shape or move across devices without a word.
    if template.dim() > 1 or len(set(map(attrgetter("device"), seqs))) > 1:
        _check_sequences(seqs)

    def copy_rows() -> Tensor:
        padded = template.new_full((len(seqs), width, *template.shape[1:]), pad_value)
        for row, seq, size in zip(padded, seqs, sizes, strict=True):
            row[:size].copy_(seq)
        return padded

    return _joined(copy_rows, seqs), lengths


def unpad(padded: Tensor, lengths: Sequence[int] | Tensor) -> list[Tensor]:
    """Strip right padding: row i keeps its first ``lengths[i]`` positions. Views, no copy.

    Args:
        padded: [B, L, *F].
        lengths: B non-negative ints, each <= L.

    Returns:
        B views of shape [n_i, *F].
    """
    sizes = as_length_list(lengths)
    if padded.dim() < 2:
        raise InvalidArgumentError(f"padded must have shape [B, L, *F], got {tuple(padded.shape)}")
    if len(sizes) != padded.shape[0]:
        raise LengthMismatchError(f"{len(sizes)} lengths for {padded.shape[0]} padded rows; they must match")
    if sizes and max(sizes) > padded.shape[1]:
        index = max(range(len(sizes)), key=sizes.__getitem__)
        raise LengthMismatchError(
            f"lengths[{index}] = {sizes[index]} exceeds the padded width L = {padded.shape[1]}"
        )
    return [row[:size] for row, size in zip(padded.unbind(0), sizes, strict=True)]
