"""`rl eval`: evaluate a checkpoint or model directory (`command`); compare them (`compare`, `plot`)."""

from __future__ import annotations

from entrepot.cli._eval.command import eval_app, evaluate

__all__ = ["eval_app", "evaluate"]
