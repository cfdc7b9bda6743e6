"""entrepot.grpo — see the package README for what it provides."""

from entrepot.grpo._version import __version__

__all__ = ["__version__"]
