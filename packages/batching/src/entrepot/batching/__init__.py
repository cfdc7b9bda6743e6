"""entrepot.batching: pad/pack helpers, remove-padding, strict-budget micro-batching, DP balance.

See the package README for an example per capability.
"""

from entrepot.batching._attention import (
    flash_attention_available,
    packed_attention_kernel,
    packed_causal_attention,
)
from entrepot.batching._balance import RankPlan, balance_across_ranks, imbalance
from entrepot.batching._columns import pack_columns, pad_columns, unpack_columns, unpad_columns
from entrepot.batching._errors import (
    BackendUnavailableError,
    BatchingError,
    InvalidArgumentError,
    InvalidLengthError,
    LengthMismatchError,
    SequenceTooLongError,
)
from entrepot.batching._loss_scale import loss_scale_factors
from entrepot.batching._micro_batch import MicroBatchPlan, best_fit_decreasing, plan_micro_batches
from entrepot.batching._packed import PackedBatch
from entrepot.batching._padding import pack, pad, unpack, unpad
from entrepot.batching._partition import greedy_lpt, karmarkar_karp
from entrepot.batching._version import __version__

__all__ = [
    "BackendUnavailableError",
    "BatchingError",
    "InvalidArgumentError",
    "InvalidLengthError",
    "LengthMismatchError",
    "MicroBatchPlan",
    "PackedBatch",
    "RankPlan",
    "SequenceTooLongError",
    "__version__",
    "balance_across_ranks",
    "best_fit_decreasing",
    "flash_attention_available",
    "greedy_lpt",
    "imbalance",
    "karmarkar_karp",
    "loss_scale_factors",
    "pack",
    "pack_columns",
    "packed_attention_kernel",
    "packed_causal_attention",
    "pad",
    "pad_columns",
    "plan_micro_batches",
    "unpack",
    "unpack_columns",
    "unpad",
    "unpad_columns",
]
