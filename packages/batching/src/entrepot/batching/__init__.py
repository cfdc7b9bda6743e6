"""entrepot.batching — see the package README for what it provides."""

from entrepot.batching._version import __version__

__all__ = ["__version__"]
