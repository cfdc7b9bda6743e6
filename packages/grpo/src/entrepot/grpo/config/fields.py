"""What every config section is built from: a field's help text and the checks that name key and value.

`check` is public so that the wings which check a config against what they own (the data wing's
sequence lengths) refuse it in the same words as the sections do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from entrepot.grpo.errors import GRPOConfigError

__all__ = ["check", "check_choice", "doc"]


def doc(text: str) -> dict[str, str]:
    """Field metadata carrying the help text the CLI shows (`dataclasses.fields(cls)[i].metadata["help"]`)."""
    return {"help": text}


def check(ok: bool, key: str, value: Any, allowed: str) -> None:
    """Raise `GRPOConfigError("<key> (<value>) must be <allowed>")` unless `ok`."""
    if not ok:
        raise GRPOConfigError(f"{key} ({value!r}) must be {allowed}")


def check_choice(key: str, value: Any, choices: Sequence[Any]) -> None:
    """`check` that `value` is one of `choices`, listing them."""
    check(value in choices, key, value, "one of " + ", ".join(repr(c) for c in choices))
