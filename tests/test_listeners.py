"""Every listener the project can open, and every place it unpickles bytes, is listed here: a new one fails.

The source of the five packages (packages/*/src) is read with `ast`, not imported, so this runs in the
metadata session without torch. A *site* is one function that calls one primitive: a socket made,
bound or listening, a server, a torch.distributed store or world, a shared-memory mapping, Ray
started, or bytes unpickled (pickle, cloudpickle, torch's object collectives, ``torch.load`` without
``weights_only=True``, yaml's unsafe loaders, ``numpy.load(allow_pickle=True)``). Each site is in
`SITES` with what it opens, where it binds and what guards it, and every listener's module is named
in entrepot-grpo's README security section ("Listeners and unpickling") and in the full table of its
docs/security.md. A site added without an entry, or an entry whose site is gone, fails
`test_every_site_is_listed_and_every_entry_is_a_site`.

Calls of the project's own modules (``_link.listen()``) are not primitives: the module they call is
where the primitive is listed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GRPO_README = ROOT / "packages" / "grpo" / "README.md"
GRPO_SECURITY = ROOT / "packages" / "grpo" / "docs" / "security.md"  # the full table

# (receiver, name) of a call; receiver None: any receiver but one of the project's own modules.
_PRIMITIVES: dict[tuple[str | None, str], str] = {
    ("socket", "socket"): "socket",
    ("socket", "socketpair"): "socket",
    ("socket", "create_server"): "socket",
    (None, "bind"): "socket",
    (None, "listen"): "socket",
    (None, "serve_forever"): "server",
    (None, "start_server"): "server",
    (None, "start_unix_server"): "server",
    (None, "HTTPServer"): "server",
    (None, "ThreadingHTTPServer"): "server",
    (None, "TCPServer"): "server",
    (None, "ThreadingTCPServer"): "server",
    (None, "UnixStreamServer"): "server",
    (None, "Listener"): "server",
    ("uvicorn", "run"): "server",
    ("web", "run_app"): "server",
    (None, "TCPStore"): "store",
    (None, "FileStore"): "store",
    (None, "init_process_group"): "store",
    (None, "mmap"): "shm",
    (None, "SharedMemory"): "shm",
    (None, "shm_open"): "shm",
    ("ray", "init"): "ray",
    ("pickle", "loads"): "unpickle",
    ("pickle", "load"): "unpickle",
    ("pickle", "Unpickler"): "unpickle",
    ("cloudpickle", "loads"): "unpickle",
    ("cloudpickle", "load"): "unpickle",
    ("dill", "loads"): "unpickle",
    ("dill", "load"): "unpickle",
    ("marshal", "loads"): "unpickle",
    ("joblib", "load"): "unpickle",
    ("pd", "read_pickle"): "unpickle",
    ("pandas", "read_pickle"): "unpickle",
    (None, "broadcast_object_list"): "unpickle",
    (None, "all_gather_object"): "unpickle",
    (None, "gather_object"): "unpickle",
    (None, "scatter_object_list"): "unpickle",
    (None, "recv_object_list"): "unpickle",
    ("yaml", "unsafe_load"): "unpickle",
    ("yaml", "full_load"): "unpickle",
}


_METHODS = {"bind", "listen", "serve_forever", "start_server", "start_unix_server"}
"""Primitives that are methods of an object of any name: keyed ``.bind``; the others by their name."""


@dataclass(frozen=True)
class Entry:
    """A listed site: what it opens (`kind`), where it binds (`binds`), what guards it (`guard`)."""

    kind: str  # port, unix socket, shm, client, probe, ray, unpickle
    binds: str
    guard: str


_TORCH_WORLD = Entry(
    "unpickle",
    "bytes from the ranks of the run's torch.distributed world (see rendezvous.join_world)",
    "the world's store and gloo/NCCL have no authentication (torch's): the ranks' network must be "
    "private; single-node runs bind loopback",
)

SITES: dict[tuple[str, str, str], Entry] = {
    # -- entrepot-grpo ---------------------------------------------------------------------------
    ("grpo/engines/weight_channel.py", "WeightChannel._accept", "socket.socket"): Entry(
        "port",
        "the address given: 127.0.0.1 (one node) or actor rank 0's node address; wildcards "
        "refused; listens only until the receiver proved the secret",
        "HMAC-SHA256 under the run's secret (entrepot.dock.signing; made by the driver, given through "
        "Ray): mutual challenge, every message signed, nothing unpickled",
    ),
    ("grpo/engines/weight_channel.py", "WeightChannel._accept", ".bind"): Entry(
        "port", "as WeightChannel._accept's socket", "as WeightChannel._accept's socket"
    ),
    ("grpo/engines/weight_channel.py", "WeightChannel._accept", ".listen"): Entry(
        "port", "as WeightChannel._accept's socket", "as WeightChannel._accept's socket"
    ),
    ("grpo/engines/rendezvous.py", "_is_free", "socket.socket"): Entry(
        "probe", "binds the rendezvous host and closes: never listens", "none needed"
    ),
    ("grpo/engines/rendezvous.py", "_is_free", ".bind"): Entry(
        "probe", "binds the rendezvous host and closes: never listens", "none needed"
    ),
    ("grpo/engines/rendezvous.py", "free_local_port", "socket.socket"): Entry(
        "probe", "binds the rendezvous host (port 0) and closes: never listens", "none needed"
    ),
    ("grpo/engines/rendezvous.py", "free_local_port", ".bind"): Entry(
        "probe", "binds the rendezvous host (port 0) and closes: never listens", "none needed"
    ),
    ("grpo/engines/rendezvous.py", "join_world", "socket.socket"): Entry(
        "port",
        "rank 0's store: 127.0.0.1 when every rank is on one node, else rank 0's node address "
        "(gloo's own listeners: the address the hostname resolves to, or GLOO_SOCKET_IFNAME)",
        "none: torch.distributed has no authentication; multi-node runs need a private network",
    ),
    ("grpo/engines/rendezvous.py", "join_world", ".bind"): Entry(
        "port", "as join_world's socket", "as join_world's socket"
    ),
    ("grpo/engines/rendezvous.py", "join_world", ".listen"): Entry(
        "port", "as join_world's socket", "as join_world's socket"
    ),
    ("grpo/engines/rendezvous.py", "join_world", "TCPStore"): Entry(
        "port",
        "serves join_world's bound socket (master_listen_fd), never one of its own",
        "as join_world's socket",
    ),
    ("grpo/engines/rendezvous.py", "join_world", "init_process_group"): Entry(
        "port",
        "tcp://: the store above; env:// or file://: torch's own (not used by the trainer)",
        "as join_world's socket",
    ),
    ("grpo/engines/rollout_vllm.py", "_own_cpu_shm_names", "broadcast_object_list"): _TORCH_WORLD,
    ("grpo/agents/server.py", "AgentServer.start", "socket.socket"): Entry(
        "port",
        "127.0.0.1 on a free port (the host given; a wildcard is refused), while the run's agent "
        "rollout lives (multiturn.agent)",
        "a bearer token per run (secrets.token_urlsafe, compared with hmac.compare_digest) on every "
        "request; JSON in and out, nothing unpickled",
    ),
    ("grpo/agents/server.py", "AgentServer.start", ".bind"): Entry(
        "port", "as AgentServer.start's socket", "as AgentServer.start's socket"
    ),
    ("grpo/run/ray_start.py", "start_ray", "ray.init"): Entry(
        "ray",
        "Ray's own servers (every interface, Ray's choice)",
        "Ray's token auth (RAY_AUTH_MODE; see 'Ray: who can reach a run')",
    ),
    # -- entrepot-dock ---------------------------------------------------------------------------
    ("dock/_link.py", "listen", "socket.socket"): Entry(
        "unix socket",
        "a file in /dev/shm (else the temp dir), mode 0600 before listen(), a random "
        "128-bit name given to the actor through Ray; one connection, then unlinked",
        "the file mode: this user's processes only",
    ),
    ("dock/_link.py", "listen", ".bind"): Entry("unix socket", "as _link.listen's", "as _link.listen's"),
    ("dock/_link.py", "listen", ".listen"): Entry("unix socket", "as _link.listen's", "as _link.listen's"),
    ("dock/_link.py", "connect", "socket.socket"): Entry(
        "client",
        "connects to a link name of the right form, a socket owned by this user",
        "the file mode and owner check",
    ),
    ("dock/_link.py", "receive", "pickle.loads"): Entry(
        "unpickle",
        "bytes from the one peer of a _link socket (mode 0600, this user's processes)",
        "the socket's file mode: only a process of this user (who could ptrace us anyway) can send",
    ),
    ("dock/_channel.py", "_map", "mmap"): Entry(
        "shm",
        "a /dev/shm file made O_EXCL|O_NOFOLLOW mode 0600 with a random name, unlinked once "
        "both ends map it; the actor maps only a regular file of this user of the expected size",
        "the file mode: this user's processes only; rows in it are data, never unpickled",
    ),
    ("dock/_dispatch.py", "dispatch_get", "broadcast_object_list"): _TORCH_WORLD,
    # -- entrepot-resharding ---------------------------------------------------------------------
    ("resharding/resharder.py", "Resharder._plan_for", "all_gather_object"): _TORCH_WORLD,
    ("resharding/_conversion_check.py", "raise_on_mismatch", "all_gather_object"): _TORCH_WORLD,
    # -- entrepot-cli ----------------------------------------------------------------------------
    ("cli/_dock_report.py", "launch_client", "ray.init"): Entry(
        "ray", "Ray's own servers (a local Ray for the report)", "Ray's token auth (RAY_AUTH_MODE)"
    ),
}


def _own_modules(tree: ast.Module) -> set[str]:
    """Names this module binds to modules of the project (``from entrepot.dock import _link``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("entrepot"):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.asname or a.name for a in node.names if a.name.startswith("entrepot"))
    return names


def _primitive(call: ast.Call, own: set[str]) -> str | None:
    """The primitive `call` is, as it is keyed in `SITES` (``socket.socket``, ``.bind``), or None."""
    fn = call.func
    if isinstance(fn, ast.Attribute):
        receiver = fn.value.id if isinstance(fn.value, ast.Name) else None
        name = fn.attr
    elif isinstance(fn, ast.Name):
        receiver, name = None, fn.id
    else:
        return None
    if receiver in own:
        return None
    keywords = {k.arg: k.value for k in call.keywords}
    if name == "load" and receiver == "torch":
        safe = keywords.get("weights_only")
        return None if isinstance(safe, ast.Constant) and safe.value is True else "torch.load"
    if name == "load" and receiver == "yaml":
        loader = keywords.get("Loader")
        return None if loader is not None and "Safe" in ast.unparse(loader) else "yaml.load"
    if name == "load" and receiver in ("np", "numpy"):
        allow = keywords.get("allow_pickle")
        return f"{receiver}.load" if isinstance(allow, ast.Constant) and allow.value is True else None
    if receiver is not None and (receiver, name) in _PRIMITIVES:
        return f"{receiver}.{name}"
    if (None, name) in _PRIMITIVES:
        return f".{name}" if name in _METHODS else name
    return None


def _sites() -> dict[tuple[str, str, str], int]:
    """Every (module under packages/<pkg>/src/entrepot, enclosing qualname, primitive) -> first line."""
    found: dict[tuple[str, str, str], int] = {}
    for path in sorted(ROOT.glob("packages/*/src/entrepot/**/*.py")):
        tree = ast.parse(path.read_text(), str(path))
        own = _own_modules(tree)
        module = path.relative_to(ROOT / "packages").parts
        where = "/".join((module[0], *module[4:]))  # grpo/engines/weight_channel.py

        def visit(node: ast.AST, scope: tuple[str, ...], where: str = where, own: set[str] = own) -> None:
            for child in ast.iter_child_nodes(node):
                inner = scope
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    inner = (*scope, child.name)
                if isinstance(child, ast.Call) and (primitive := _primitive(child, own)):
                    found.setdefault((where, ".".join(scope) or "<module>", primitive), child.lineno)
                visit(child, inner)

        visit(tree, ())
    return found


def test_the_scan_sees_the_known_primitives() -> None:
    """The scanner itself: what each form of call counts as (so a quiet scan means a clean source)."""
    own = {"_link"}

    def one(source: str) -> str | None:
        call = ast.parse(source).body[0].value  # type: ignore[attr-defined]
        return _primitive(call, own)

    assert one("socket.socket(socket.AF_INET)") == "socket.socket"
    assert one("server.bind(('0.0.0.0', 1))") == ".bind"
    assert one("_link.listen()") is None  # the project's own module: listed where it is defined
    assert one("dist.TCPStore('h', 1, 2, True)") == "TCPStore"
    assert one("pickle.loads(data)") == "pickle.loads"
    assert one("torch.load(f)") == "torch.load"
    assert one("torch.load(f, weights_only=False)") == "torch.load"
    assert one("torch.load(f, weights_only=True)") is None
    assert one("yaml.load(f)") == "yaml.load"
    assert one("yaml.load(f, Loader=yaml.SafeLoader)") is None
    assert one("np.load(f, allow_pickle=True)") == "np.load"
    assert one("dist.all_gather_object(out, x)") == "all_gather_object"
    assert one("uvicorn.run(app, host='0.0.0.0')") == "uvicorn.run"
    assert one("http.server.ThreadingHTTPServer(('', 8000), H)") == "ThreadingHTTPServer"
    assert one("json.loads(s)") is None


def test_every_site_is_listed_and_every_entry_is_a_site() -> None:
    found = _sites()
    unlisted = {f"{k} (line {line})" for k, line in found.items() if k not in SITES}
    assert not unlisted, (
        "a listener or unpickling the listener audit does not know (tests/test_listeners.py): bind it "
        "to loopback or the node's address, authenticate it (entrepot.dock.signing), never unpickle "
        f"what it receives, and list it in SITES and the grpo README: {sorted(unlisted)}"
    )
    gone = sorted(set(SITES) - set(found))
    assert not gone, f"SITES lists what the source no longer has (remove them): {gone}"


@pytest.mark.parametrize("site", sorted(SITES), ids=lambda s: f"{s[0]}:{s[1]}:{s[2]}")
def test_each_entry_says_what_it_opens_where_and_what_guards_it(site: tuple[str, str, str]) -> None:
    entry = SITES[site]
    assert entry.kind in {"port", "unix socket", "shm", "client", "probe", "ray", "unpickle"}
    assert entry.binds and entry.guard
    assert ("0.0.0.0" not in entry.binds and "every interface" not in entry.binds) or entry.kind == "ray"


@pytest.mark.parametrize(
    ("page", "heading"), [(GRPO_README, "### "), (GRPO_SECURITY, "## ")], ids=["readme", "docs"]
)
def test_the_grpo_readme_names_every_listener(page: Path, heading: str) -> None:
    """Each module that opens a port, a socket or shared memory is named in the security section of the
    README (its list) and of docs/security.md (the full table)."""
    text = page.read_text()
    assert f"{heading}Listeners and unpickling" in text
    section = text.split(f"{heading}Listeners and unpickling", 1)[1].split("\n## ", 1)[0]
    listeners = {m for (m, _, _), e in SITES.items() if e.kind in {"port", "unix socket", "shm", "ray"}}
    missing = sorted(m for m in listeners if m.rsplit("/", 1)[-1].removesuffix(".py") not in section)
    assert not missing, f"{page.name}'s 'Listeners and unpickling' does not name {missing}"
