"""entrepot.cli — the `rl` command. It composes the other packages and holds no algorithm."""

from entrepot.cli._version import __version__

__all__ = ["__version__"]
