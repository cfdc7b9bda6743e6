"""Turn the forms a caller may put into one internal form, validating as we go (nothing is stored here).

Accepted per column (B = number of indexes, L = padded length, T = total valid elements):
    Tensor [B]                          one scalar per row
    Tensor [B, L] (+ lengths [B])       padded rows; without lengths every row has L elements
    Tensor [T] + lengths [B]            packed rows (flat + lengths)
    (tensor, lengths) tuple             the same two forms with their lengths attached
    list of B tensors                   0-d tensors / numbers (scalars) or 1-D tensors (rows)
A TensorDict is read like a dict. The internal form is `ColumnData(flat, lengths)`, lengths None for
scalar columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import torch

from entrepot.dock._errors import ColumnLayoutError, LengthMismatchError, RowCountMismatchError
from entrepot.dock._rowcopy import RowSource, gather_into, unpad_into


class ColumnData:
    """One column of a put, unpadded: B rows + lengths int64 [B], or values [B] with lengths None.

    Rows are held as the caller gave them: a flat tensor, a list of row tensors, a padded [B, L]
    tensor, or (put_prompts' fan-out) a RowSource. `copy_into` copies the valid part once, straight
    into the store (padded and RowSource rows a memcpy each, see _rowcopy); `flat` makes one tensor
    only when a caller needs it. A padded column also keeps its lengths as Python ints (`sizes`):
    its checks and its row copies read them without another torch op.
    """

    def __init__(
        self,
        flat: torch.Tensor | None,
        lengths: torch.Tensor | None,
        pieces: list[torch.Tensor] | None = None,
        padded: torch.Tensor | None = None,
        rows: RowSource | None = None,
        sizes: list[int] | None = None,
    ) -> None:
        self._flat = flat
        self.lengths = lengths
        self._pieces = pieces
        self._padded = padded
        self._rows = rows
        self.sizes = sizes

    @property
    def scalar(self) -> bool:
        return self.lengths is None

    @property
    def dtype(self) -> torch.dtype:
        if self._flat is not None:
            return self._flat.dtype
        if self._padded is not None:
            return self._padded.dtype
        if self._rows is not None:
            return self._rows.dtype
        assert self._pieces  # a column of zero rows is built with a flat tensor
        return self._pieces[0].dtype

    @cached_property
    def numel(self) -> int:
        if self._flat is not None:
            return self._flat.numel()
        if self.sizes is not None:
            return sum(self.sizes)
        assert self.lengths is not None
        return int(self.lengths.sum())

    def to(self, dtype: torch.dtype) -> ColumnData:
        """This column with its rows in `dtype`, on the CPU and contiguous: `copy_into` is then memcpys only.

        Itself when that holds already (the usual case); else converted copies (this allocates, so a put
        does it before it changes anything).
        """
        if self._flat is not None:
            flat = self._flat
            if _plain(flat, dtype):
                return self
            return ColumnData(flat.to("cpu", dtype).contiguous(), self.lengths)
        if self._padded is not None:
            padded = self._padded
            if _plain(padded, dtype):
                return self
            stored = padded.to("cpu", dtype).contiguous()
            return ColumnData(None, self.lengths, padded=stored, sizes=self.sizes)
        if self._rows is not None:
            rows = self._rows
            if all(_plain(source, dtype) for source in rows.sources):
                return self
            sources = [source.to("cpu", dtype).contiguous() for source in rows.sources]
            converted = RowSource(sources, rows.which, rows.starts, rows.lengths)
            return ColumnData(None, self.lengths, rows=converted)
        assert self._pieces is not None
        if all(piece.dtype == dtype and piece.device.type == "cpu" for piece in self._pieces):
            return self
        return ColumnData(None, self.lengths, [piece.to("cpu", dtype) for piece in self._pieces])

    @property
    def flat(self) -> torch.Tensor:
        if self._flat is None:
            flat = torch.empty(self.numel, dtype=self.dtype)
            self.copy_into(flat)
            self._flat, self._pieces, self._padded, self._rows = flat, None, None, None
        return self._flat

    def select(self, index: torch.Tensor) -> ColumnData:
        """Rows `index` (int64 [b]) of this column; sequence rows are not copied (a RowSource to them)."""
        if self.lengths is None:
            return ColumnData(self.flat[index], None)
        return ColumnData(None, self.lengths[index], rows=self._row_source().select(index))

    def _row_source(self) -> RowSource:
        """Where each row of a sequence column is, whatever form the caller gave it in."""
        assert self.lengths is not None
        if self._rows is not None:
            return self._rows
        if self._padded is not None:
            padded = self._padded.cpu().contiguous()
            starts = torch.arange(padded.shape[0], dtype=torch.int64) * padded.shape[1]
            return RowSource([padded.reshape(-1)], None, starts, self.lengths)
        if self._pieces is not None:
            rows = torch.arange(len(self._pieces), dtype=torch.int64)
            flat = [piece.reshape(-1) for piece in self._pieces]
            return RowSource(flat, rows, torch.zeros_like(rows), self.lengths)
        assert self._flat is not None
        return RowSource.packed(self._flat, self.lengths)

    def copy_into(self, out: torch.Tensor) -> None:
        """Write the values back to back into `out` [numel] (converting to its dtype)."""
        if self._padded is not None:
            assert self.sizes is not None  # a padded column is made with them (see _from_tensor)
            unpad_into(self._padded, self.sizes, out)
        elif self._rows is not None:
            gather_into(self._rows, out)
        elif self._pieces is not None:
            torch.cat(self._pieces, out=out)
        else:
            assert self._flat is not None
            out.copy_(self._flat)


def _plain(tensor: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether `tensor` can be memcpy'd as rows of `dtype` as it is."""
    return tensor.dtype == dtype and tensor.device.type == "cpu" and tensor.stride(-1) == 1


def _as_lengths(column: str, lengths: Any, num_rows: int) -> torch.Tensor:
    """`lengths` as int64 [num_rows]; the caller checks that none is negative."""
    if isinstance(lengths, torch.Tensor):
        _check_stored(column, lengths, "lengths")
    try:
        lengths = torch.as_tensor(lengths)
    except (TypeError, ValueError, RuntimeError, OverflowError):
        raise LengthMismatchError(
            column, f"lengths must be a 1-D integer tensor, got {lengths!r:.80}"
        ) from None
    if lengths.dtype.is_floating_point or lengths.dtype == torch.bool or lengths.ndim != 1:
        raise LengthMismatchError(
            column, f"lengths must be a 1-D integer tensor, got shape {tuple(lengths.shape)} {lengths.dtype}"
        )
    if lengths.numel() != num_rows:
        raise RowCountMismatchError(column, num_rows, lengths.numel())
    if lengths.dtype != torch.int64:
        lengths = lengths.to(torch.int64)
    return lengths


def _check_sizes(column: str, sizes: list[int], width: int) -> None:
    """Raise unless every length of a padded tensor's rows is in [0, width]."""
    if not sizes:
        return
    if min(sizes) < 0:
        raise LengthMismatchError(column, f"lengths must be >= 0, got {min(sizes)}")
    longest = max(sizes)
    if longest > width:
        row = sizes.index(longest)
        raise LengthMismatchError(
            column, f"row {row} has length {longest} but the padded tensor is only {width} wide"
        )


def _check_stored(column: str, tensor: torch.Tensor, what: str = "data") -> None:
    """ColumnLayoutError unless `tensor` holds its elements in memory (not meta, sparse or nested)."""
    if tensor.is_meta or tensor.layout != torch.strided or tensor.is_nested:
        kind = "meta" if tensor.is_meta else "nested" if tensor.is_nested else str(tensor.layout)
        raise ColumnLayoutError(
            column, f"{what} must be a dense tensor holding its values, got a {kind} tensor"
        )


def _from_list(column: str, items: Sequence[Any], scalar_hint: bool | None) -> ColumnData:
    try:
        tensors = [torch.as_tensor(item) for item in items]
    except (TypeError, ValueError, RuntimeError, OverflowError):
        kinds = sorted({type(item).__name__ for item in items})
        raise ColumnLayoutError(column, f"list items must be tensors or numbers, got {kinds}") from None
    held = {(t.layout, t.device.type) for t in tensors}  # one set, as for ndims and dtypes below
    if any(layout != torch.strided or device == "meta" for layout, device in held):
        _check_stored(column, next(t for t in tensors if t.layout != torch.strided or t.is_meta))
    if not tensors:
        return ColumnData(torch.empty(0), None if scalar_hint else torch.empty(0, dtype=torch.int64))
    ndims = {t.ndim for t in tensors}
    if ndims == {0} or (scalar_hint and ndims <= {0, 1} and all(t.numel() == 1 for t in tensors)):
        return ColumnData(torch.stack([t.reshape(()) for t in tensors]), None)
    if ndims != {1}:
        raise ColumnLayoutError(column, f"list items must all be 0-d (scalars) or all 1-D, got ndims {ndims}")
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise ColumnLayoutError(column, f"list items have different dtypes {sorted(map(str, dtypes))}")
    lengths = torch.tensor([t.numel() for t in tensors], dtype=torch.int64)
    return ColumnData(None, lengths, tensors)


def _from_tensor(
    column: str, data: torch.Tensor, lengths: Any, num_rows: int, scalar_hint: bool | None
) -> ColumnData:
    if data.ndim == 0 or data.ndim > 2:
        raise ColumnLayoutError(
            column, f"expected [B], [B, L] or packed [T] data, got shape {tuple(data.shape)}"
        )
    if lengths is None:
        if data.ndim == 1:
            return ColumnData(data, None)
        if scalar_hint and data.shape[1] == 1:
            return ColumnData(data[:, 0], None)
        return ColumnData(data.reshape(-1), torch.full((data.shape[0],), data.shape[1], dtype=torch.int64))
    lens = _as_lengths(column, lengths, num_rows)
    if data.ndim == 1:  # packed
        if lens.numel() and int(lens.min()) < 0:
            raise LengthMismatchError(column, f"lengths must be >= 0, got {int(lens.min())}")
        if int(lens.sum()) != data.numel():
            raise LengthMismatchError(
                column, f"lengths sum to {int(lens.sum())} but the packed tensor has {data.numel()} elements"
            )
        return ColumnData(data, lens)
    if data.shape[0] != num_rows:
        raise RowCountMismatchError(column, num_rows, data.shape[0])
    sizes = lens.tolist()  # the row copies need them as ints anyway
    _check_sizes(column, sizes, data.shape[1])
    # The store copies the valid part of each row once; the padding is never kept.
    return ColumnData(None, lens, padded=data, sizes=sizes)


def normalize_column(
    column: str, value: Any, lengths: Any, num_rows: int, scalar_hint: bool | None
) -> ColumnData:
    """One column of a put, in any accepted form, as ColumnData with its row count checked."""
    if isinstance(value, ColumnData):  # already normalised (GRPODock.put_prompts' fan-out)
        out = value
    else:
        out = _from_value(column, value, lengths, num_rows, scalar_hint)
    rows = out.numel if out.lengths is None else out.lengths.numel()
    if rows != num_rows:
        raise RowCountMismatchError(column, num_rows, rows)
    return out


def _from_value(column: str, value: Any, lengths: Any, num_rows: int, scalar_hint: bool | None) -> ColumnData:
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], torch.Tensor):
        if lengths is not None:
            raise ColumnLayoutError(column, "lengths given twice (in the tuple and in `lengths`)")
        value, lengths = value
    if isinstance(value, torch.Tensor):
        _check_stored(column, value)
        return _from_tensor(column, value.detach(), lengths, num_rows, scalar_hint)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if lengths is not None:
            raise ColumnLayoutError(
                column, "a list of tensors carries its own lengths; do not pass `lengths`"
            )
        return _from_list(column, value, scalar_hint)
    raise ColumnLayoutError(column, f"cannot store a {type(value).__name__}; pass tensors (see put)")


def scalar_hint_matters(value: Any, lengths: Any) -> bool:
    """Whether `normalize_column` reads `value` differently when the column is known to hold scalars.

    Only two forms do: a [B, 1] tensor without lengths (B scalars, else B rows of 1 element) and a list
    of one-element items not all 0-d (scalars, else rows of 1 element or mixed ndims). A caller that
    does not know a column's kind (its spec leaves it open and the dock fixed it since) needs to learn
    it for these forms only.
    """
    if lengths is not None or isinstance(value, ColumnData):
        return False
    if isinstance(value, torch.Tensor):
        return value.ndim == 2 and value.shape[1] == 1
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], torch.Tensor):
        return False  # (data, lengths)
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)):
        return False
    one_dim = False
    for item in value:
        if not isinstance(item, torch.Tensor | int | float):
            return False  # not a scalar; normalize_column says what is wrong with it
        item = torch.as_tensor(item)
        if item.ndim > 1 or item.numel() != 1:
            return False
        one_dim = one_dim or item.ndim == 1
    return one_dim


def normalize_put(
    data: Mapping[str, Any],
    lengths: Mapping[str, Any] | None,
    num_rows: int,
    scalar_hints: Mapping[str, bool | None],
) -> dict[str, ColumnData]:
    """Every column of a put as ColumnData; `scalar_hints`: column -> scalar kind (None: unknown)."""
    lengths = dict(lengths or {})
    stray = set(lengths) - set(data.keys())
    if stray:
        name = sorted(stray)[0]
        raise ColumnLayoutError(name, "lengths given for a column that is not in the data")
    return {
        column: normalize_column(column, value, lengths.get(column), num_rows, scalar_hints.get(column))
        for column, value in data.items()
    }
