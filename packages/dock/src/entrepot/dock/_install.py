"""The `pip install` commands entrepot-dock's messages print, rendered in one place.

The entrepot packages are not on PyPI yet: they install from the checkout's folders (the root
README's command 1), so a command names the package's folder relative to the repository root and
says to run it there. Once the packages are published, `requirement` names the distribution instead.
packages/cli/tests/test_install_hints.py checks that each folder exists and each extra is declared.
"""

from __future__ import annotations

__all__ = ["COMMANDS", "RAY", "pip_install"]

PACKAGE_DIR = "./packages/dock"
FROM_ROOT = "(from the repository root)"


def requirement(extra: str) -> str:
    """This package with `extra`, as pip takes it on the command line (quoted for the shell)."""
    return f'"{PACKAGE_DIR}[{extra}]"'


def pip_install(extra: str) -> str:
    """The command that installs this package's `extra`: `pip install "./packages/dock[ray]" (...)`."""
    return f"pip install {requirement(extra)} {FROM_ROOT}"


RAY = pip_install("ray")

# Every command a message of this package prints (the test reads this).
COMMANDS = (RAY,)
