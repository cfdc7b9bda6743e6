"""entrepot.dock — see the package README for what it provides."""

from entrepot.dock._version import __version__

__all__ = ["__version__"]
