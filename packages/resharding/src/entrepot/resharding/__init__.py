"""entrepot.resharding — see the package README for what it provides."""

from entrepot.resharding._version import __version__

__all__ = ["__version__"]
