"""How the CLI reports a user's mistake: one line on stderr, exit code 2, no traceback.

Library packages raise typed exceptions whose messages already name the key, the value and what
is allowed; the CLI only decides which of them are the user's mistake (bad YAML key, wrong type,
impossible combination, missing file) and prints them without a traceback. Anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import NoReturn

import typer

USAGE_EXIT_CODE = 2


class CLIUsageError(ValueError):
    """A command-line value the CLI itself rejects (e.g. a lengths file that holds no numbers)."""


def one_line(message: str) -> str:
    """Collapse a possibly multi-line message (YAML parser errors span lines) onto one line."""
    return " ".join(message.split())


def fail(message: str) -> NoReturn:
    """Print `error: <message>` on one line to stderr and exit with code 2."""
    typer.echo(f"error: {one_line(message)}", err=True)
    raise typer.Exit(USAGE_EXIT_CODE)


def _user_error_types() -> tuple[type[BaseException], ...]:
    """The exception types that mean "the user asked for something impossible".

    Imported here, not at module level, so `rl --help` loads none of the library packages.
    """
    types: list[type[BaseException]] = [CLIUsageError, FileNotFoundError, IsADirectoryError]
    with contextlib.suppress(ImportError):
        from entrepot.grpo.errors import CheckpointError, DataError, GRPOConfigError, RewardError

        types += [GRPOConfigError, DataError, CheckpointError, RewardError]
    if "entrepot.batching" in sys.modules:
        from entrepot.batching import BatchingError

        types.append(BatchingError)
    if "entrepot.dock" in sys.modules:
        from entrepot.dock import DockError

        types.append(DockError)
    return tuple(types)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Turn the user-mistake exceptions raised inside the block into `fail(...)`."""
    try:
        yield
    except typer.Exit:
        raise
    except Exception as exc:
        if isinstance(exc, _user_error_types()):
            fail(_describe(exc))
        raise


def _describe(exc: BaseException) -> str:
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        return f"file {str(exc.filename)!r} does not exist"
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return text or type(exc).__name__
