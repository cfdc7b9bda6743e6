"""entrepot.batching: pad/pack helpers, remove-padding, strict-budget micro-batching, DP balance.

See the package README for an example per capability.
"""

from entrepot.batching._attention import flash_attention_available, packed_causal_attention
from entrepot.batching._columns import pack_columns, pad_columns, unpack_columns, unpad_columns
from entrepot.batching._errors import (
    BackendUnavailableError,
    BatchingError,
    InvalidArgumentError,
    InvalidLengthError,
    LengthMismatchError,
    SequenceTooLongError,
)
from entrepot.batching._packed import PackedBatch
from entrepot.batching._padding import pack, pad, unpack, unpad
from entrepot.batching._version import __version__

__all__ = [
    "BackendUnavailableError",
    "BatchingError",
    "InvalidArgumentError",
    "InvalidLengthError",
    "LengthMismatchError",
    "PackedBatch",
    "SequenceTooLongError",
    "__version__",
    "flash_attention_available",
    "pack",
    "pack_columns",
    "packed_causal_attention",
    "pad",
    "pad_columns",
    "unpack",
    "unpack_columns",
    "unpad",
    "unpad_columns",
]
