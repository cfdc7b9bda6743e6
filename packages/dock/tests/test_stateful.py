"""Hypothesis state machine: the dock against a dictionary-of-rows reference model."""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from entrepot.dock import ColumnSpec, DockTimeout, ExperienceDock

CAPACITY = 12
COLUMNS = {
    "a": ColumnSpec(torch.int64, False),
    "b": ColumnSpec(torch.float32, False),
    "s": ColumnSpec(torch.float32, True),
}
CONSUMERS = ["c0", "c1"]

rows_st = st.lists(st.integers(0, CAPACITY - 1), min_size=1, max_size=6, unique=True)


class DockModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dock = ExperienceDock(CAPACITY, columns=COLUMNS, consumers=CONSUMERS)
        self.cells: dict[str, dict[int, torch.Tensor]] = {name: {} for name in COLUMNS}
        self.consumed: dict[str, set[int]] = {name: set() for name in CONSUMERS}
        self.counter = 0

    def live(self) -> set[int]:
        return set().union(*(set(col) for col in self.cells.values()))

    @rule(rows=rows_st, column=st.sampled_from(sorted(COLUMNS)), data=st.data())
    def put(self, rows, column, data):
        values = []
        for _ in rows:
            self.counter += 1
            if column == "s":
                values.append(torch.tensor(float(self.counter)))
            else:
                n = data.draw(st.integers(0, 5))
                dtype = torch.int64 if column == "a" else torch.float32
                values.append((torch.arange(n) + 100 * self.counter).to(dtype))
        self.dock.put({column: torch.stack(values) if column == "s" else values}, rows)
        for row, value in zip(rows, values, strict=True):
            self.cells[column][row] = value

    @rule(
        consumer=st.sampled_from(CONSUMERS),
        columns=st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=3, unique=True),
        count=st.integers(1, 5),
        data=st.data(),
    )
    def get(self, consumer, columns, count, data):
        min_count = data.draw(st.integers(1, count))
        live = self.live()
        remaining = len(live - self.consumed[consumer])
        available = sorted(
            r for r in live if r not in self.consumed[consumer] and all(r in self.cells[c] for c in columns)
        )
        if remaining == 0:
            assert self.dock.get(consumer, columns, count, min_count=min_count, timeout=0) is None
            return
        if len(available) < min(min_count, remaining):
            try:
                self.dock.get(consumer, columns, count, min_count=min_count, timeout=0)
            except DockTimeout:
                return
            raise AssertionError("expected DockTimeout")
        batch = self.dock.get(consumer, columns, count, min_count=min_count, timeout=0, layout="packed")
        expected = available[:count]
        assert batch.indexes.tolist() == expected
        for column in columns:
            want = [self.cells[column][r] for r in expected]
            if column == "s":
                assert torch.equal(batch.data[column], torch.stack(want))
            else:
                assert torch.equal(batch.data[column], torch.cat(want))
                assert batch.lengths[column].tolist() == [w.numel() for w in want]
        self.consumed[consumer].update(expected)

    @rule(rows=rows_st)
    def clear_rows(self, rows):
        self.dock.clear(rows)
        for col in self.cells.values():
            for r in rows:
                col.pop(r, None)
        for done in self.consumed.values():
            done.difference_update(rows)

    @precondition(lambda self: self.counter % 7 == 3)
    @rule()
    def clear_all(self):
        self.dock.clear()
        self.cells = {name: {} for name in COLUMNS}
        self.consumed = {name: set() for name in CONSUMERS}

    @rule()
    def save_and_restore(self):
        fresh = ExperienceDock(CAPACITY, columns=COLUMNS, consumers=CONSUMERS)
        fresh.load_state_dict(self.dock.state_dict())
        self.dock = fresh

    @invariant()
    def progress_matches(self):
        live = self.live()
        for consumer in CONSUMERS:
            assert self.dock.progress(consumer) == {
                "consumed": len(self.consumed[consumer]),
                "live": len(live),
            }
            assert self.dock.all_consumed(consumer) == (self.consumed[consumer] >= live)
        metrics = self.dock.metrics()
        for column, cells in self.cells.items():
            assert metrics[f"dock/rows_ready/{column}"] == len(cells)
        stored = sum(v.numel() * v.element_size() for c in ("a", "b") for v in self.cells[c].values())
        assert metrics["dock/bytes_stored"] == stored


TestDockModel = DockModel.TestCase
TestDockModel.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
