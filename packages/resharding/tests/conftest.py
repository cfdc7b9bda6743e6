"""One forkserver for every multi-process test of this package.

It imports torch, megatron-core and transformers once; each test then forks its ranks in
~0.1 s instead of spawning fresh interpreters that import them again (seconds each on a loaded
2-core machine). Modules that are not installed are skipped by the forkserver. Nothing it
imports patches torch: the megatron CPU mode is turned on in the forked ranks only.
"""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

TESTS = Path(__file__).parent
sys.path[:0] = [str(TESTS), str(TESTS / "support")]  # the ranks import the worker modules by name

multiprocessing.set_forkserver_preload(
    [
        "torch",
        "torch.distributed",
        "entrepot.resharding",
        "_reshard_workers",
        "megatron_workers",
        "megatron.core.models.gpt.gpt_model",
        "transformers.models.gpt2.modeling_gpt2",
        "transformers.models.llama.modeling_llama",
        "transformers.models.qwen2.modeling_qwen2",
        "transformers.models.qwen3.modeling_qwen3",
    ]
)
