"""The calls of the clients of a dock in another process: every call of the protocol is there, and a
call they do not carry is a typed error naming it (issue 58: ``load_state_dict`` was an AttributeError).

No Ray is started: the clients are made without their actors (only their classes are looked at).
"""

from __future__ import annotations

import pickle

import pytest

from entrepot.dock import DockError, GRPODockClient, NotOnClientError
from entrepot.dock.ray import RayDockClient
from entrepot.dock.sharded import ShardedDockClient

CLIENTS: list[type[RayDockClient] | type[ShardedDockClient]] = [RayDockClient, ShardedDockClient]


@pytest.mark.parametrize("cls", CLIENTS)
def test_every_call_of_the_protocol_is_on_the_client(
    cls: type[RayDockClient] | type[ShardedDockClient],
) -> None:
    calls = [name for name in dir(GRPODockClient) if not name.startswith("_")]
    assert "put_prompts" in calls and "load" in calls
    assert [name for name in calls if not hasattr(cls, name)] == []


@pytest.mark.parametrize("cls", CLIENTS)
@pytest.mark.parametrize(
    ("name", "hint"), [("load_state_dict", "load(path)"), ("state_dict", "save(path)"), ("capacity", "")]
)
def test_a_call_not_on_the_client_is_a_typed_error_listing_its_calls(
    cls: type[RayDockClient] | type[ShardedDockClient], name: str, hint: str
) -> None:
    client = cls.__new__(cls)
    with pytest.raises(
        NotOnClientError, match=rf"{cls.__name__} has no '{name}': the call is not on the client"
    ) as info:
        getattr(client, name)
    assert isinstance(info.value, DockError) and isinstance(info.value, AttributeError)  # hasattr still works
    assert hint in str(info.value) and "put, " in str(info.value) and "load, " in str(info.value)
    assert info.value.call == name
    assert not hasattr(client, name)
    error = pickle.loads(pickle.dumps(info.value))  # crosses Ray intact
    assert type(error) is NotOnClientError and str(error) == str(info.value)


def test_private_names_stay_plain_attribute_errors() -> None:
    client = RayDockClient.__new__(RayDockClient)
    with pytest.raises(AttributeError) as info:
        client._missing  # noqa: B018 - pickling and copy probe such names
    assert type(info.value) is AttributeError
