"""The prompt groups between the rollout and training: which may start, which a step trains, which drop.

Every group the rollout starts is admitted here first (its prompt's position in the data stream, its
dock rows, the policy version that samples its first token). A step takes `prompts_per_step` finished
groups; the staleness bound `max_staleness` (policy versions between a group's oldest token and the
step that trains it) is kept by one of two policies:

- ``wait``: steps train groups in admission order, and the rollout admits a group only when the step
  that will train it (the queue ahead of it, `prompts_per_step` groups a step) is at most
  `max_staleness` versions past the rollout's weights. The bound holds for every token, and no prompt
  is ever dropped; the rollout waits when it is that far ahead.
- ``drop``: the rollout keeps `(max_staleness + 1) x prompts_per_step` groups going; a step trains the
  first groups to finish and drops those already past the bound (their prompts are not trained).

The positions of the groups not yet trained are what a checkpoint keeps (`outstanding`): a resumed run
admits them again first, so a prompt is never skipped nor trained twice across a kill.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from entrepot.grpo.config.trainer import StalenessPolicy

__all__ = ["Group", "Ledger", "Taken"]


@dataclass
class Group:
    """One prompt's group of responses.

    Attributes:
        first_row: its dock rows are `first_row .. first_row + n - 1`.
        position: the prompt's position in the data stream.
        version: the rollout's policy version when it was admitted (its oldest token's).
        finished: every response generated and scored.
    """

    first_row: int
    position: int
    version: int
    finished: bool = False


@dataclass
class Taken:
    """A step's groups (admission order) and the groups it dropped as too stale."""

    groups: list[Group]
    dropped: list[Group]
    waited_s: float


class Ledger:
    """Thread-safe bookkeeping of admitted groups (the rollout admits and finishes, the trainer takes).

    Args:
        prompts_per_step: groups a step trains.
        max_staleness: the bound, in policy versions.
        policy: ``wait`` or ``drop`` (see the module docstring).
    """

    def __init__(self, prompts_per_step: int, max_staleness: int, policy: StalenessPolicy) -> None:
        self.per_step, self.max_staleness, self.policy = prompts_per_step, max_staleness, policy
        self.trained_version = 0  # updates done: the version the next step trains
        self.next_position = 0  # the data stream's next new prompt
        self._again: list[int] = []  # positions to admit before new ones (a resumed run's outstanding)
        self._reserved: set[int] = set()  # positions handed to the rollout, not admitted yet
        self._groups: dict[int, Group] = {}  # first_row -> group, in admission order
        self._held = 0  # groups taken (or dropped) whose dock rows are not cleared yet
        self._cond = threading.Condition()

    @property
    def capacity(self) -> int:
        """Most groups outstanding at once (the dock holds this many)."""
        return (self.max_staleness + 1) * self.per_step

    # -- the rollout's side ---------------------------------------------------------------------

    def admissible(self, rollout_version: int) -> int:
        """How many groups the rollout (holding weights `rollout_version`) may admit now."""
        with self._cond:
            outstanding = len(self._groups) + self._held
            if self.policy == "drop":
                return max(self.capacity - outstanding, 0)
            # the k-th group outstanding trains at step trained_version + k // per_step
            ahead = rollout_version + self.max_staleness - self.trained_version + 1
            return max(min(ahead * self.per_step, self.capacity) - outstanding, 0)

    def positions(self, count: int) -> list[int]:
        """The data positions of the next `count` groups: outstanding ones of a resumed run first."""
        with self._cond:
            again, self._again = self._again[:count], self._again[count:]
            new = list(range(self.next_position, self.next_position + count - len(again)))
            self.next_position += len(new)
            self._reserved.update(again + new)
            return again + new

    def admit(self, first_rows: list[int], positions: list[int], version: int) -> None:
        with self._cond:
            for row, position in zip(first_rows, positions, strict=True):
                self._groups[row] = Group(row, position, version)
                self._reserved.discard(position)

    def finish(self, first_rows: list[int]) -> None:
        """The groups at `first_rows` are generated and scored."""
        with self._cond:
            for row in first_rows:
                self._groups[row].finished = True
            self._cond.notify_all()

    def wait_for_room(self, seconds: float) -> None:
        """Sleep up to `seconds` or until a step takes groups (the rollout has nothing to do)."""
        with self._cond:
            self._cond.wait(seconds)

    # -- the trainer's side ---------------------------------------------------------------------

    def take(self, timeout: float, alive: Callable[[], None]) -> Taken:
        """The next step's groups, waiting at most `timeout` seconds; `alive()` raises if the rollout
        died (it is called while waiting)."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout
        dropped: list[Group] = []
        with self._cond:
            while True:
                dropped += self._drop_stale()
                groups = self._ready()
                if groups is not None:
                    for group in groups:
                        del self._groups[group.first_row]
                    self._held += len(groups) + len(dropped)
                    return Taken(groups, dropped, time.perf_counter() - t0)
                if time.monotonic() >= deadline:
                    raise TimeoutError(self._waiting_for())
                self._cond.release()
                try:
                    alive()
                finally:
                    self._cond.acquire()
                self._cond.wait(0.05)

    def trained(self) -> None:
        """A step's update is done: the next one trains version `trained_version`."""
        with self._cond:
            self.trained_version += 1
            self._cond.notify_all()

    def release(self, groups: int) -> None:
        """`groups` taken or dropped groups left the dock: their rows are free for new prompts."""
        with self._cond:
            self._held -= groups
            self._cond.notify_all()

    def _ready(self) -> list[Group] | None:
        if self.policy == "wait":
            head = list(self._groups.values())[: self.per_step]
            return head if len(head) == self.per_step and all(g.finished for g in head) else None
        finished = [g for g in self._groups.values() if g.finished]
        return finished[: self.per_step] if len(finished) >= self.per_step else None

    def _drop_stale(self) -> list[Group]:
        if self.policy != "drop":
            return []
        stale = [g for g in self._groups.values()
                 if g.finished and self.trained_version - g.version > self.max_staleness]  # fmt: skip
        for group in stale:
            del self._groups[group.first_row]
        if stale:
            self._cond.notify_all()
        return stale

    def _waiting_for(self) -> str:
        unfinished = [g.position for g in self._groups.values() if not g.finished]
        done = sum(g.finished for g in self._groups.values())
        return (f"{done} finished group(s) of the {self.per_step} a step needs; prompts still "
                f"generating: {unfinished[:8]}{'...' if len(unfinished) > 8 else ''}")  # fmt: skip

    # -- checkpoints ----------------------------------------------------------------------------

    def outstanding(self) -> list[int]:
        """Positions drawn but not trained (nor dropped), ascending: admitted, being admitted, or
        waiting to be admitted again."""
        with self._cond:
            return sorted([g.position for g in self._groups.values()] + [*self._reserved, *self._again])

    def snapshot(self) -> tuple[list[int], int]:
        """(`outstanding`, `next_position`) read together: what a checkpoint keeps."""
        with self._cond:
            return self.outstanding(), self.next_position

    def restore(self, trained_version: int, next_position: int, outstanding: list[int]) -> None:
        """Continue a checkpointed run: its version, its next new prompt, and the prompts to redo
        (nothing else is outstanding: the dock of a resumed run starts empty)."""
        with self._cond:
            self.trained_version, self.next_position = trained_version, next_position
            self._again = sorted(outstanding)
            self._groups, self._reserved, self._held = {}, set(), 0
