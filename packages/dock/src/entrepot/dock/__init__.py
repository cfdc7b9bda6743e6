"""entrepot.dock: the experience store between rollout and training, in-process or as a Ray actor.

`ExperienceDock` is the core store (rows x columns, ready and consumed bitmaps, blocking gets;
`Sampler` and `Padding` are a get's rarer options);
`GRPODock` is its GRPO preset; `DockClient` is the protocol stages program against;
`entrepot.dock.ray` (extra `ray`) runs a dock in a Ray actor, `entrepot.dock.sharded` spreads one
over Ray nodes; `dispatch_get` hands a batch to a
whole model-parallel group with a constant number of collectives.
"""

from entrepot.dock._batch import Batch
from entrepot.dock._client import DockClient, GRPODockClient
from entrepot.dock._columns import ColumnSpec
from entrepot.dock._dispatch import dispatch_get
from entrepot.dock._dock import ExperienceDock
from entrepot.dock._errors import (
    AlreadyConsumedError,
    ArgumentTypeError,
    ColumnLayoutError,
    DockConfigError,
    DockError,
    DockFullError,
    DockMemoryError,
    DockShardLostError,
    DockStateError,
    DockTimeout,
    DuplicateIndexError,
    GroupSizeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    LeaseError,
    LengthMismatchError,
    LossyDtypeError,
    NotOnClientError,
    NotReadyError,
    RowCountMismatchError,
    UnknownColumnError,
    UnknownConsumerError,
)
from entrepot.dock._grpo import GRPO_COLUMNS, GRPO_CONSUMERS, GRPODock
from entrepot.dock._leases import Lease
from entrepot.dock._options import Padding, Sampler
from entrepot.dock._sampling import dp_range_indexes
from entrepot.dock._version import __version__

__all__ = [
    "GRPO_COLUMNS",
    "GRPO_CONSUMERS",
    "AlreadyConsumedError",
    "ArgumentTypeError",
    "Batch",
    "ColumnLayoutError",
    "ColumnSpec",
    "DockClient",
    "DockConfigError",
    "DockError",
    "DockFullError",
    "DockMemoryError",
    "DockShardLostError",
    "DockStateError",
    "DockTimeout",
    "DuplicateIndexError",
    "ExperienceDock",
    "GRPODock",
    "GRPODockClient",
    "GroupSizeError",
    "IndexOutOfRangeError",
    "InvalidArgumentError",
    "Lease",
    "LeaseError",
    "LengthMismatchError",
    "LossyDtypeError",
    "NotOnClientError",
    "NotReadyError",
    "Padding",
    "RowCountMismatchError",
    "Sampler",
    "UnknownColumnError",
    "UnknownConsumerError",
    "__version__",
    "dispatch_get",
    "dp_range_indexes",
]
