"""The shared-memory channel (_channel) on its own: what the actor agrees to map, and the table."""

from __future__ import annotations

import os

import pytest
import torch

from entrepot.dock import InvalidArgumentError
from entrepot.dock._channel import (
    DIRECTORY,
    MIN_CAPACITY,
    attach,
    capacity_for,
    create,
    names_made_by,
    new_name,
    unlink,
)
from entrepot.dock._channel_table import ChannelTable


@pytest.fixture
def channel():
    made = create(MIN_CAPACITY)
    yield made
    unlink(made)


def test_both_sides_see_the_same_bytes_after_the_name_is_gone(channel):
    other = attach(channel.name, channel.capacity)
    unlink(channel)
    assert not os.path.exists(os.path.join(DIRECTORY, channel.name))
    channel.buffer[:4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert other.buffer[:4].tolist() == [1, 2, 3, 4]


def test_the_actor_maps_only_a_channel_file_of_this_user_and_size(channel, tmp_path):
    for name in ("../../etc/passwd", "entrepot-dock-channel-x", channel.name + "0"):
        with pytest.raises(InvalidArgumentError, match="is not a dock channel name"):
            attach(name, MIN_CAPACITY)
    with pytest.raises(InvalidArgumentError, match=f"is not a {2 * MIN_CAPACITY}-byte file"):
        attach(channel.name, 2 * MIN_CAPACITY)
    missing = f"entrepot-dock-channel-{os.getpid()}-" + "0" * 32
    with pytest.raises(InvalidArgumentError, match="cannot be opened"):
        attach(missing, MIN_CAPACITY)
    assert not os.path.exists(os.path.join(DIRECTORY, missing))  # nothing was created by the attempt
    target = tmp_path / "target"
    target.write_bytes(b"\0" * MIN_CAPACITY)
    link = f"entrepot-dock-channel-{os.getpid()}-" + "1" * 32
    os.symlink(target, os.path.join(DIRECTORY, link))
    try:
        with pytest.raises(InvalidArgumentError, match="cannot be opened"):
            attach(link, MIN_CAPACITY)  # a link is never followed, whatever it points at
    finally:
        os.unlink(os.path.join(DIRECTORY, link))


def test_the_table_hands_out_room_only_in_a_known_channel_large_enough(channel):
    table = ChannelTable(limit=2)
    assert table.room(None, 10) is None and table.room(channel.name, 10) is None
    table.attach(channel.name, channel.capacity)
    room = table.room(channel.name, 100)
    assert room is not None and room.numel() == 100
    room.fill_(7)
    assert channel.buffer[:100].eq(7).all() and not channel.buffer[100].eq(7)
    assert table.room(channel.name, channel.capacity + 1) is None
    table.detach(channel.name)
    assert table.room(channel.name, 100) is None and len(table) == 0


def test_the_table_drops_its_least_recently_used_channel_past_its_limit():
    made = [create(MIN_CAPACITY) for _ in range(3)]
    try:
        table = ChannelTable(limit=2)
        table.attach(made[0].name, MIN_CAPACITY)
        table.attach(made[1].name, MIN_CAPACITY)
        assert table.room(made[0].name, 1) is not None  # used: made[1] is now the oldest
        table.attach(made[2].name, MIN_CAPACITY)
        assert len(table) == 2 and table.room(made[1].name, 1) is None
        assert table.room(made[0].name, 1) is not None and table.room(made[2].name, 1) is not None
    finally:
        for each in made:
            unlink(each)


def test_capacity_leaves_room_to_grow_in_whole_mib():
    assert capacity_for(0) == MIN_CAPACITY
    assert capacity_for(MIN_CAPACITY) == 2 * MIN_CAPACITY  # 1.5 MiB rounded up
    assert capacity_for(10 * MIN_CAPACITY) == 15 * MIN_CAPACITY


def test_names_say_whose_they_are_and_a_process_counts_only_its_own():
    """Issue 58: a test's check for leftovers found another run's channel in /dev/shm and failed."""
    others = [f"entrepot-dock-channel-{os.getpid() + 1}-" + "2" * 32, f"entrepot-dock-link-1-{'3' * 32}"]
    for name in others:  # what another run on this machine has there
        open(os.path.join(DIRECTORY, name), "x").close()
    try:
        before = names_made_by(os.getpid())
        channel = create(MIN_CAPACITY)
        assert channel.name.startswith(f"entrepot-dock-channel-{os.getpid()}-")
        assert new_name("link").startswith(f"entrepot-dock-link-{os.getpid()}-")
        assert names_made_by(os.getpid()) == sorted([*before, channel.name])
        unlink(channel)
        assert names_made_by(os.getpid()) == before
        assert all(os.path.exists(os.path.join(DIRECTORY, name)) for name in others)  # untouched
        assert names_made_by(os.getpid() + 1) == others[:1]
    finally:
        for name in others:
            os.unlink(os.path.join(DIRECTORY, name))
