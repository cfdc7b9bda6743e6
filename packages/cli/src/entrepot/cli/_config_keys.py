"""Walk the GRPOConfig dataclass tree into rows of (dotted key, type, default, help) for `config keys`."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any

from entrepot.cli._errors import CLIUsageError


@dataclass(frozen=True)
class KeyRow:
    """One leaf of the configuration tree."""

    key: str
    type_name: str
    default: str
    help: str


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in typing.get_args(tp))
    args = typing.get_args(tp)
    if args:
        inner = ", ".join(_type_name(a) for a in args)
        name = getattr(origin, "__name__", None)
        return (
            f"{name}[{inner}]" if name and name not in ("UnionType", "Union") else inner.replace(", ", " | ")
        )
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _walk(node: Any, prefix: str) -> list[KeyRow]:
    rows: list[KeyRow] = []
    hints = typing.get_type_hints(type(node))
    for field in dataclasses.fields(node):
        key = f"{prefix}{field.name}"
        value = getattr(node, field.name)
        if dataclasses.is_dataclass(value):
            rows += _walk(value, f"{key}.")
            continue
        rows.append(KeyRow(key, _type_name(hints[field.name]), repr(value), field.metadata.get("help", "")))
    return rows


def describe_keys(section: str | None) -> list[KeyRow]:
    """Rows for every key of the embedded default, optionally only those under `section`."""
    from entrepot.grpo.config import GRPOConfig

    rows = _walk(GRPOConfig(), "")
    if section is None:
        return rows
    picked = [r for r in rows if r.key == section or r.key.startswith(f"{section}.")]
    if not picked:
        sections = sorted({r.key.split(".")[0] for r in rows if "." in r.key})
        raise CLIUsageError(f"unknown section {section!r}; allowed: {', '.join(sections)}")
    return picked


def render_keys(rows: list[KeyRow]) -> None:
    """Print the rows as a rich table."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="GRPO configuration keys", show_lines=False)
    for column in ("key", "type", "default", "help"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in (row.key, row.type_name, row.default, row.help)))
    Console().print(table)
