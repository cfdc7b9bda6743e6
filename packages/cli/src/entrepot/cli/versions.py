"""Installed versions of the Entrepot distributions and the stack they run on.

Read from package metadata only, so `rl --version` imports nothing heavy.
"""

from __future__ import annotations

from importlib import metadata

ENTREPOT_DISTRIBUTIONS = (
    "entrepot-batching",
    "entrepot-dock",
    "entrepot-resharding",
    "entrepot-grpo",
    "entrepot-cli",
)
STACK_DISTRIBUTIONS = ("torch", "ray", "tensordict", "transformers", "megatron-core", "vllm")


def installed_versions(names: tuple[str, ...]) -> dict[str, str]:
    """Map each installed distribution in `names` to its version; absent ones are left out."""
    found: dict[str, str] = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found
