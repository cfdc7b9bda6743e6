"""`rl doctor`: what this machine has, and what a config needs of it, as one report.

Versions come from package metadata and extras from `importlib.util.find_spec` (nothing heavy is
imported to name them: megatron.core alone takes seconds), devices from torch and /proc/meminfo,
Ray's address and auth mode from the config and the environment as Ray 2.60's `ray.init` reads
them (Ray is not started), and the memory figures from `entrepot.grpo.run.memory.estimate_memory`.
The doctor reports and never refuses: a config that does not fit is a line of the report.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from entrepot.cli._install import EXTRA_COMMANDS
from entrepot.cli.versions import ENTREPOT_DISTRIBUTIONS, STACK_DISTRIBUTIONS

if TYPE_CHECKING:
    from entrepot.grpo.config import GRPOConfig
    from entrepot.grpo.run.memory import MemoryEstimate

GIB = 2**30

# (module, what uses it, whether `config` does, what becomes of such a run without it)
_EXTRAS = (
    ("megatron.core", "engine.train=megatron", lambda c: "megatron.core" in _engine_modules(c), "refused"),
    ("vllm", "engine.rollout=vllm", lambda c: "vllm" in _engine_modules(c), "refused"),
    ("vllm_ascend", "vLLM on engine.device=npu", lambda c: "vllm" in _engine_modules(c) and _npu(c), "fails"),
    ("torch_npu", "engine.device=npu", lambda c: _npu(c), "refused"),
    ("tensorboard", "logging.tensorboard=true", lambda c: c.logging.tensorboard is True, "refused"),
    ("gguf", "rl model import", lambda c: False, "refused"),
)


@dataclass
class Section:
    """One block of the report: a title and (label, value) rows."""

    title: str
    rows: list[tuple[str, str]] = field(default_factory=list)


def build_report(config: GRPOConfig) -> list[Section]:
    """Every section of the report for `config` (the memory estimate may raise a user error)."""
    from entrepot.grpo.run.memory import estimate_memory

    estimate = estimate_memory(config)
    return [
        _versions(),
        _devices(),
        _extras(config),
        _ray(config),
        _memory(config, estimate),
    ]


def render(sections: list[Section]) -> None:
    """Print the sections as aligned two-column rich tables."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    for section in sections:
        table = Table(title=section.title, title_justify="left", show_header=False, box=None, pad_edge=False)
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        for label, value in section.rows:
            table.add_row(escape(label), escape(value))
        console.print(table)
        console.print()


def size(num_bytes: int) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1 (``6.61 MiB``)."""
    value, unit = float(num_bytes), "B"
    for next_unit in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, next_unit
    return f"{num_bytes} B" if unit == "B" else f"{value:.2f} {unit}"


# -- sections ------------------------------------------------------------------------------------


def _versions() -> Section:
    section = Section("Versions", [("python", platform.python_version())])
    for name in STACK_DISTRIBUTIONS:
        section.rows.append((name, _installed(name) or "not installed"))
    for name in ENTREPOT_DISTRIBUTIONS:
        section.rows.append((name, _entrepot_version(name)))
    return section


def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _entrepot_version(distribution: str) -> str:
    """The version of the code that runs and where it lives; install metadata that disagrees is named."""
    package = "entrepot." + distribution.removeprefix("entrepot-")
    if importlib.util.find_spec(package) is None:
        return "not installed"
    module = importlib.import_module(f"{package}._version")
    version = str(module.__version__)
    where = Path(module.__file__ or "").parents[2]  # <src>/entrepot/<name>/_version.py
    installed = _installed(distribution)
    stale = f"; installed metadata says {installed}" if installed not in (None, version) else ""
    return f"{version} ({where}{stale})"


def _devices() -> Section:
    import torch

    usable, total = len(os.sched_getaffinity(0)), os.cpu_count()
    memory = _host_memory()
    host = (
        "unknown (no /proc/meminfo)"
        if memory is None
        else f"{size(memory[0])} total, {size(memory[1])} available"
    )
    section = Section("Devices", [("cpu cores", f"{usable} usable of {total}"), ("host memory", host)])
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            section.rows.append((f"cuda:{index}", f"{props.name}, {size(props.total_memory)}"))
    else:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA"
        section.rows.append(("cuda", f"none (torch {torch.__version__}, built with {build})"))
    npu = "torch_npu not installed" if importlib.util.find_spec("torch_npu") is None else _npu_devices()
    section.rows.append(("npu", npu))
    return section


def _extras(config: GRPOConfig) -> Section:
    section = Section("Engine extras (found on the path, not imported)")
    for module, used_by, uses, without in _EXTRAS:
        found = _on_path(module)
        status = "installed" if found else "not installed"
        if uses(config):
            status += ", this config uses it" if found else f", this config uses it: the run is {without}"
        row = f"{status} ({used_by})"
        if uses(config) and not found:
            row += f"; to install it: {EXTRA_COMMANDS[module]}"
        section.rows.append((module, row))
    return section


def _ray(config: GRPOConfig) -> Section:
    from entrepot.grpo.run.deployment import uses_ray

    if not uses_ray(config.resources, config.parallel, config.dock):
        why = "resources.use_ray=false" if config.resources.use_ray is False else "auto: one worker per role"
        return Section("Ray", [("address", f"not used ({why}: one process)")])
    address, how = ray_address(config)
    token = _ray_token_source() or "none found"
    return Section("Ray", [("address", address), ("auth mode", ray_auth_mode(how)), ("token", token)])


def _memory(config: GRPOConfig, estimate: MemoryEstimate) -> Section:
    e = estimate
    if e.reference:
        reference = "algorithm.kl_coef > 0"
    elif config.algorithm.kl_coef > 0:
        reference = "on its own workers: resources.colocate=false"
    else:
        reference = "none (algorithm.kl_coef = 0)"
    rows = [
        ("policy parameters", f"{e.num_params:,} (exact)"),
        ("params", f"{size(e.params)} (this rank's training shard)"),
        ("grads", size(e.grads)),
        ("optimizer", f"{size(e.optimizer)} (AdamW: 2 moments)"),
        ("reference", f"{size(e.reference)} ({reference})"),
        ("reward models", f"{size(e.reward_models)} ({_reward_models_basis(config)})"),
        ("rollout weights", f"{size(e.rollout_weights)} (the rollout engine's own copy)"),
        ("resharded copy", f"{size(e.resharded_copy)} (allocated by the train -> rollout resharding)"),
    ]
    if e.reshard_scratch:
        rows.append(("reshard scratch", f"{size(e.reshard_scratch)} (at most engine.reshard_bucket_mb)"))
    rows.append(("KV cache", f"{size(e.kv_cache)} ({e.kv_cache_basis})"))
    rows.append(("activations", f"{size(e.activations)} ({e.activations_basis})"))
    rows.append(("logits", f"{size(e.logits)} (the update's LM head)"))
    if e.runtime:
        rows.append(("runtime", f"{size(e.runtime)} (the process: Python, torch, transformers, tokenizer)"))
    for stage, (device, host) in e.stages.items():
        mark = "  <- peak" if stage == e.peak_stage else ""
        label = stage if stage == "update" else f"switch: {stage}"
        rows.append((label, f"{size(device)} on the device, {size(host)} in host memory{mark}"))
    train = config.parallel.train
    layout = f"DP {config.resources.num_actor_workers} x TP {train.tensor} x PP {train.pipeline}"
    rows.append(
        ("actor ranks", f"{e.num_ranks} ({layout}), all on this machine unless a cluster spreads them")
    )
    rows.append(("verdict", verdict(e)))
    title = "Memory estimate per actor rank (float32 unless model.reference_dtype says otherwise)"
    return Section(title, rows)


def memory_lines(estimate: MemoryEstimate) -> str:
    """The estimate's peak and its parts, for `rl grpo config validate` (two lines)."""
    e = estimate
    where = "the device" if not e.on_cpu else "host memory (engine.device=cpu)"
    peak = e.peak_bytes + (e.offloaded_bytes if e.on_cpu else 0)
    parts = [("weights", e.params), ("reference", e.reference), ("grads", e.grads + e.lane_grads),
             ("optimizer", e.optimizer), ("activations", e.activations), ("logits", e.logits),
             ("KV cache", e.kv_cache), ("rollout copy", e.rollout_weights),
             ("runtime", e.runtime)]  # fmt: skip
    return (
        f"memory estimate per actor rank: peak {size(peak)} in {where}, at the {e.peak_stage}\n"
        "  " + ", ".join(f"{name} {size(value)}" for name, value in parts)
    )


def _reward_models_basis(config: GRPOConfig) -> str:
    if not config.reward.models:
        return "none: rule verifiers only"
    where = "co-located" if config.resources.colocate else "on their own workers: resources.colocate=false"
    return f"{len(config.reward.models)} in reward.models, {where}"


# -- pieces --------------------------------------------------------------------------------------


def verdict(estimate: MemoryEstimate) -> str:
    """`fits` or `does not fit: needs X GiB, has Y GiB`, against host memory (cpu) or each GPU (cuda)."""
    kind = estimate.device.split(":")[0]
    if kind == "cpu":
        memory = _host_memory()
        if memory is None:
            return f"cannot tell: host memory unknown; needs {size(estimate.host_need_bytes)}"
        ranks = f"{estimate.num_ranks} rank{'s' if estimate.num_ranks > 1 else ''}"
        return _compare(estimate.host_need_bytes, memory[1], f"host memory available, for {ranks}")
    if kind != "cuda":
        return f"cannot tell: {kind} memory is not read; needs {size(estimate.peak_bytes)} per device"
    import torch

    if not torch.cuda.is_available():
        return f"cannot tell: no CUDA device here; needs {size(estimate.peak_bytes)} per GPU"
    smallest = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    return _compare(estimate.peak_bytes, smallest, "per GPU")


def _compare(need: int, have: int, what: str) -> str:
    if need <= have:
        return f"fits: needs {size(need)}, has {size(have)} ({what})"
    return f"does not fit: needs {need / GIB:.2f} GiB, has {have / GIB:.2f} GiB ({what})"


def ray_address(config: GRPOConfig) -> tuple[str, str]:
    """The cluster `ray.init` would join and how it was chosen: explicit, recorded, local or none."""
    configured = config.resources.ray_address
    if configured not in (None, "auto"):
        return f"{configured} (resources.ray_address)", "explicit"
    from_env = os.environ.get("RAY_ADDRESS")
    if from_env:
        return f"{from_env} (RAY_ADDRESS)", "explicit"
    recorded = _ray_temp_dir() / "ray_current_cluster"
    if recorded.is_file():
        return f"{recorded.read_text().strip()} (the cluster `ray start` recorded in {recorded})", "recorded"
    if configured == "auto":
        return "none found: resources.ray_address=auto finds no cluster, the run would fail", "none"
    return "none: rl grpo train starts a local cluster on 127.0.0.1", "local"


def ray_auth_mode(how: str) -> str:
    """Token auth or none, as `ray.init` decides it for a cluster chosen `how` (Ray 2.60's rules)."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return f"{mode.lower()} (RAY_AUTH_MODE)"
    if how == "local":
        return "token: Ray turns it on for a cluster it starts (RAY_AUTH_MODE unset; =disabled opts out)"
    if how == "recorded":
        found = _ray_token_source() is not None
        return "token (a token is found, RAY_AUTH_MODE unset)" if found else "disabled (no token found)"
    return "disabled on this side: RAY_AUTH_MODE unset and an explicit address never turns it on"


def _ray_token_source() -> str | None:
    """Where Ray would read its auth token from (never the token itself); None when nowhere."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN is set"
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path:
        return f"RAY_AUTH_TOKEN_PATH={path} ({'exists' if Path(path).is_file() else 'missing'})"
    default = Path.home() / ".ray" / "auth_token"
    return f"{default} exists" if default.is_file() else None


def _ray_temp_dir() -> Path:
    # where Ray keeps `ray_current_cluster`: RAY_TMPDIR, else TMPDIR (Linux), else /tmp, then "ray"
    base = os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(base) / "ray"


def _host_memory() -> tuple[int, int] | None:
    """(total, available) host memory in bytes from /proc/meminfo; None where it does not exist."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    kib = {line.split(":")[0]: int(line.split()[1]) for line in lines if line.split()[1:2]}
    return kib["MemTotal"] * 1024, kib.get("MemAvailable", kib["MemFree"]) * 1024


def _on_path(module: str) -> bool:
    """Whether `module` is on the path (a missing parent package counts as missing, not as an error)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # find_spec("megatron.core") imports `megatron` first
        return False


def _engine_modules(config: GRPOConfig) -> set[str]:
    """The optional modules the configured engines need (`entrepot.grpo.engines.registry`)."""
    from entrepot.grpo.engines.registry import choose_engines

    engines = choose_engines(config.engine)
    return {module for module in (engines.train.module, engines.rollout.module) if module is not None}


def _npu(config: GRPOConfig) -> bool:
    return config.engine.device.split(":")[0] == "npu"


def _npu_devices() -> str:
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    count = torch.npu.device_count()  # type: ignore[attr-defined]
    return f"{count} device(s)" if count else "torch_npu installed, no device"
