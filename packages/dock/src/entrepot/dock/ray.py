"""The dock as a Ray actor, behind the same DockClient API (needs the dock's `ray` extra).

    client = RayDockClient.launch(GRPODock, prompts_num=256, n_samples_per_prompt=8)
    rows = client.put_prompts(prompts)
    batch = client.get("actor_rollout", ["prompts"], 64)

The actor is threaded: gets (which may block) run in a "get" concurrency group of `max_concurrency`
threads, puts and control calls in their own small group, so blocked getters never starve a put.
It asks for a fraction of a CPU. Data crosses Ray as one uint8 numpy buffer per call (see _wire):
Ray stores it in the object store once and the receiver maps it without copying; nothing is
pickled per row or per column. A client on the actor's node moves its large puts and get replies
through a shared-memory channel instead (see _channel): memory both processes map, so the rows skip
Ray's object store. The client handle is picklable: pass it to other actors.

Anyone who can reach the Ray cluster can call the actor, so it runs only what a client needs: the
methods in `CALLABLE_METHODS` (a private method or an unknown name is refused), and `save` / `load`
only under the `files_root` it was launched with.

The parts, each in its own module: the actor (_ray_actor), the client (_ray_client) and the
client's end of the same-node channel (_ray_channel).
"""

from __future__ import annotations

from entrepot.dock import _install

try:
    import ray  # noqa: F401 - checked here, used by the modules below
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"entrepot.dock.ray needs Ray: {_install.RAY}") from error

from entrepot.dock._ray_actor import CALLABLE_METHODS, DockActor
from entrepot.dock._ray_client import RayDockClient

__all__ = ["CALLABLE_METHODS", "DockActor", "RayDockClient"]
