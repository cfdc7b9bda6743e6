"""Round-trip checks of layout conversions: the inference tensors, mapped back, must equal the source.

A layout conversion (QKV de-interleave, expert stacking, MLA split) moves elements, so a sum of
them cannot tell a correct conversion from a permuted one. Instead, after ``train_to_infer``
has written a group's inference tensors, ``infer_to_train`` (each rule's inverse, written
independently of the forward direction) maps them back, and the result must equal the group's
training-layout tensors bit for bit. Both sit on the same rank, so the comparison is exact
rather than a checksum, and costs one read of each; the training-layout tensors themselves
were checksummed against their source slices on the ranks that sent them.

What this catches: a conversion that drops, duplicates, changes or moves elements relative to
its inverse (rows of a QKV permuted, two heads or experts swapped). What it cannot catch: a
forward and an inverse that agree on a layout the inference engine does not use; the adaptor
tests compare both directions with a reference written from the HF tensors.

Comparisons stay on the device until ``failures()``, which syncs once per reshard.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.distributed as dist

from entrepot.resharding._plan import ReshardPlan
from entrepot.resharding.adaptors.base import WeightAdaptor
from entrepot.resharding.errors import ChecksumMismatchError, ReshardError

__all__ = ["ConversionCheck", "raise_on_mismatch"]

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """0-d bool on the device: do the bit patterns differ (NaNs compare by their bits)?"""
    bits = _BITS[a.element_size()]
    return torch.ne(a.view(bits), b.view(bits)).any()


class ConversionCheck:
    """The round-trip checks of one reshard's layout conversions on this rank.

    Args:
        adaptor: the adaptor whose ``train_to_infer`` produced the tensors and whose
            ``infer_to_train`` maps them back.
    """

    def __init__(self, adaptor: WeightAdaptor) -> None:
        self.adaptor = adaptor
        self._pending: list[tuple[str, torch.Tensor]] = []
        self._failed: list[str] = []

    def add(self, sources: Mapping[str, torch.Tensor], converted: Mapping[str, torch.Tensor]) -> None:
        """Check that ``converted`` (inference names) maps back to ``sources`` (training names)."""
        experts = [self.adaptor.param_spec(name).expert for name in sources]
        first_expert = min((e for e in experts if e is not None), default=0)
        try:
            back = self.adaptor.infer_to_train(converted, first_expert)
        except ReshardError as err:  # a shape the inverse cannot read: report it with the others
            self._failed.append(f"{sorted(sources)} could not be mapped back ({err})")
            return
        for name in sorted(set(back) - set(sources)):
            self._failed.append(f"{name!r} came back from {sorted(converted)} but was not converted")
        for name, source in sources.items():
            returned = back.get(name)
            if returned is None:
                self._failed.append(f"{name!r} did not come back from {sorted(converted)}")
            elif returned.shape != source.shape or returned.dtype != source.dtype:
                self._failed.append(
                    f"{name!r} {tuple(source.shape)} {source.dtype} came back as "
                    f"{tuple(returned.shape)} {returned.dtype}"
                )
            else:
                self._pending.append((name, _differs(source, returned)))

    def failures(self) -> list[str]:
        """One line per training tensor that did not survive its round trip (syncs the device once)."""
        if self._pending:
            flags = torch.stack([flag for _, flag in self._pending]).cpu().tolist()
            self._failed += [
                f"{name!r} differs after train -> infer -> train"
                for (name, _), bad in zip(self._pending, flags, strict=True)
                if bad
            ]
            self._pending = []
        return self._failed


def raise_on_mismatch(
    plan: ReshardPlan, checks: torch.Tensor, failed_conversions: list[str], group: dist.ProcessGroup | None
) -> None:
    """Raise ``ChecksumMismatchError`` on every rank if any rank saw a mismatch.

    ``checks`` is ``[segment, (source checksum, destination checksum)]`` plus a last row whose
    second column counts this rank's failed conversions (``failed_conversions``, by name).
    """
    if plan.world_size > 1:
        dist.all_reduce(checks, group=group)
    checks = checks.cpu()
    failures = int(checks[-1, 1])
    bad = (checks[:-1, 0] != checks[:-1, 1]).nonzero().flatten().tolist()
    if not bad and not failures:
        return
    if failures and plan.world_size > 1:  # every rank gets here together: the count was reduced
        gathered: list[list[str]] = [[] for _ in range(plan.world_size)]
        dist.all_gather_object(gathered, failed_conversions, group=group)
        failed_conversions = [line for lines in gathered for line in lines]
    segments = {s.index: s for r in plan.rounds for s in r.segments}
    lines = [
        f"{s.name!r} rank {s.src} -> rank {s.dst}, dim {s.dim} [{s.dst_start}:{s.dst_start + s.length}]"
        for s in (segments[i] for i in bad[:5])
    ]
    raise ChecksumMismatchError(
        f"resharded weights differ from their source: {len(bad)} slice(s) and {failures} "
        f"layout conversion(s) failed verification; first slices: {'; '.join(lines) or 'none'}; "
        f"first conversions: {'; '.join(failed_conversions[:5]) or 'none'}"
    )
