"""An actor rank's weights out to the asynchronous rollout: published in memory, or sent over a channel."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from entrepot.grpo.engines.policy import Policy
    from entrepot.grpo.engines.weight_channel import WeightChannel
    from entrepot.grpo.engines.weight_sync import PublishedWeights

__all__ = ["WeightOut"]


class WeightOut:
    """Publishes one actor rank's weights in the rollout engine's layout (every rank joins the
    resharding; rank 0 publishes) and, on Ray, sends them over a `WeightChannel` made at first use.

    Args:
        policy: the rank's policy (its manager reshards).
        rank: the rank's global index.
        name: the rank's name in errors (``actor rank 0``).
        timeout: seconds a channel wait may take (`trainer.weight_sync_timeout_s`).
    """

    def __init__(self, policy: Policy, rank: int, name: str, timeout: float) -> None:
        self.policy, self.rank, self.name, self.timeout = policy, rank, name, timeout
        self._channel: WeightChannel | None = None

    def publish(self, version: int) -> PublishedWeights | None:
        """The weights copied into checksummed buckets as `version` (None on ranks other than 0)."""
        from entrepot.grpo.engines.weight_sync import publish

        manager = self.policy.manager
        weights = manager.resharder.reshard(manager.train_engine.named_train_parameters())
        try:
            return publish(version, weights) if self.rank == 0 else None
        finally:
            del weights
            manager.resharder.destroy_buffers()

    def send(self, version: int, channel: str, secret: bytes) -> int:
        """Publish and send `version` to the rollout rank over the channel at ``host:port`` (signed with
        the run's `secret`); bytes sent."""
        weights = self.publish(version)
        if weights is None:
            return 0
        if self._channel is None:
            from entrepot.grpo.engines.weight_channel import WeightChannel

            self._channel = WeightChannel(
                channel, secret, sender=True, timeout=self.timeout, source=self.name, target="rollout rank 0"
            )
        self._channel.send(weights)
        return weights.nbytes
