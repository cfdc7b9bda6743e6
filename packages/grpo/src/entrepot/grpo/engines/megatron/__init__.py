"""The megatron-core training engine of the actor (`engine.train: megatron`).

`MegatronTrainer` trains a megatron-core `GPTModel` with `parallel.train`'s TP / PP (VPP) through
megatron's forward-backward schedules, DDP and optimizer; log-probs and entropy are computed on the
vocab-parallel logits (`vocab_parallel`), never gathering the full vocabulary on one rank. Every
rollout the weights are resharded into the rollout engine's layout (entrepot.resharding). On CPU
megatron-core runs in entrepot.resharding's supported CPU mode (gloo); on GPU with NCCL, same code.

Imported only when that engine is configured: megatron-core is an optional extra.
"""

from entrepot.grpo.engines.megatron.trainer import MegatronTrainer
from entrepot.grpo.engines.megatron.world import init_model_parallel

__all__ = ["MegatronTrainer", "init_model_parallel"]
