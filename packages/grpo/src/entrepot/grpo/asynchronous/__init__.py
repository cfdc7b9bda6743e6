"""Asynchronous training (`trainer.mode: async`): a rollout running beside the trainer, fed by the dock.

`sampling.AsyncSampling` is the step's sampling mode; `rollout_loop.RolloutLoop` the rollout thread;
`ledger.Ledger` the prompt groups between the two and the staleness bound. The weights travel through
`entrepot.grpo.engines.weight_sync`.
"""

from entrepot.grpo.asynchronous.sampling import AsyncSampling

__all__ = ["AsyncSampling"]
