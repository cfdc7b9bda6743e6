"""`rl dock bench`: run the experience dock's benchmark workload at a chosen size."""

from __future__ import annotations

import typer

dock_app = typer.Typer(
    name="dock", help="Inspect and benchmark the experience dock (entrepot.dock).", no_args_is_help=True
)
