"""Concurrency: 8 producer and 8 consumer threads over 102,400 rows; every row reaches every consumer once."""

from __future__ import annotations

import threading

import torch

from entrepot.dock import ExperienceDock

NUM_ROWS = 102_400
CONSUMERS = ["c0", "c1", "c2", "c3"]  # two threads each: 8 consumer threads


def _expected_lengths(rows: torch.Tensor) -> torch.Tensor:
    return rows % 7


def test_eight_producers_eight_consumers_exactly_once():
    dock = ExperienceDock(NUM_ROWS, columns=["id", "x"], consumers=CONSUMERS)
    dock.put({"id": torch.arange(NUM_ROWS)}, torch.arange(NUM_ROWS))  # rows exist; x comes from producers
    order = torch.randperm(NUM_ROWS, generator=torch.Generator().manual_seed(0))
    errors: list[BaseException] = []
    received: dict[str, list[torch.Tensor]] = {name: [] for name in CONSUMERS}
    lock = threading.Lock()

    def produce(part: torch.Tensor) -> None:
        try:
            for chunk in part.split(256):
                lengths = _expected_lengths(chunk)
                flat = torch.repeat_interleave(chunk, lengths).to(torch.int32)
                dock.put({"x": (flat, lengths)}, chunk)
        except BaseException as error:  # surfaced by the main thread
            errors.append(error)

    def consume(name: str) -> None:
        try:
            while (
                batch := dock.get(name, ["x", "id"], 512, min_count=1, layout="packed", timeout=60)
            ) is not None:
                rows = batch.indexes
                assert torch.equal(batch.data["id"], rows)
                assert torch.equal(batch.lengths["x"], _expected_lengths(rows))
                assert torch.equal(
                    batch.data["x"], torch.repeat_interleave(rows, batch.lengths["x"]).to(torch.int32)
                )
                with lock:
                    received[name].append(rows)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=produce, args=(part,)) for part in order.chunk(8)]
    threads += [threading.Thread(target=consume, args=(name,)) for name in CONSUMERS for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors[0]
    assert not any(thread.is_alive() for thread in threads)
    for name in CONSUMERS:
        rows = torch.cat(received[name])
        assert rows.numel() == NUM_ROWS  # no row twice ...
        assert torch.equal(rows.sort().values, torch.arange(NUM_ROWS))  # ... and none missing
        assert dock.all_consumed(name)
