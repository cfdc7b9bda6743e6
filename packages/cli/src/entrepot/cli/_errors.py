"""How the CLI reports a user's mistake: one line on stderr, exit code 2, no traceback.

Library packages raise typed exceptions whose messages already name the key, the value and what
is allowed; the CLI only decides which of them are the user's mistake (bad YAML key, wrong type,
impossible combination, missing file) and prints them without a traceback. Anything else is a
bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
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


def _grpo_error_types() -> tuple[type[BaseException], ...]:
    """entrepot.grpo's user-mistake errors, imported here so `rl --help` loads no library package."""
    from entrepot.grpo.errors import (
        CheckpointError,
        DataError,
        EvalError,
        GRPOConfigError,
        RayStartError,
        RewardError,
    )

    return (GRPOConfigError, DataError, CheckpointError, RewardError, EvalError, RayStartError)


@contextlib.contextmanager
def user_errors(*extra: type[BaseException]) -> Iterator[None]:
    """Turn user-mistake exceptions raised inside the block into `fail(...)`.

    Always covered: `CLIUsageError`, a missing file, and entrepot.grpo's configuration, data,
    checkpoint and reward errors. `extra` adds a command's own (e.g. `BatchingError` for
    `rl batching plan`, where the lengths and budget come straight from the user). Other library
    errors are bugs and keep their traceback.
    """
    try:
        yield
    except typer.Exit:
        raise
    except Exception as exc:
        always: tuple[type[BaseException], ...] = (CLIUsageError, FileNotFoundError, IsADirectoryError)
        if isinstance(exc, (*always, *_grpo_error_types(), *extra)):
            fail(_describe(exc))
        raise


def _describe(exc: BaseException) -> str:
    # A Ray task error re-raised as its cause carries the worker traceback in its text; the cause
    # alone holds the message.
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        exc = cause
    if isinstance(exc, FileNotFoundError) and exc.filename is not None:
        return f"file {str(exc.filename)!r} does not exist"
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return text or type(exc).__name__
