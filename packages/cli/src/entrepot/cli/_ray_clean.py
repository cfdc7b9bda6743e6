"""`rl ray-clean RUN`: stop what a killed run left of the local Ray it started, and nothing else.

A run that starts its own Ray records the session in its folder (``ray_session.json``,
`entrepot.grpo.run.ray_session`); the processes of that session still running once its driver is
gone are stopped. Other Rays on the machine (other runs', a cluster's) are not touched, which is
what ``ray stop --force`` would do. `rl grpo train --resume RUN` does the same before it starts.
"""

from __future__ import annotations

from pathlib import Path

import typer

from entrepot.cli._errors import CLIUsageError


def clean_run(run_dir: Path) -> None:
    """Stop the leftover processes of the Ray session `run_dir` records; print what was stopped."""
    if not run_dir.is_dir():
        raise CLIUsageError(f"{str(run_dir)!r} is not a run directory")
    from entrepot.grpo.run.ray_session import RAY_SESSION_FILE, read_session, stop_leftovers

    session = read_session(run_dir)
    if session is None:
        typer.echo(
            f"nothing to stop: {str(run_dir)!r} records no Ray session ({RAY_SESSION_FILE}): the run "
            "did not start a Ray of its own (it ran in one process or joined a cluster), or it was cleaned"
        )
        return
    if session.driver_alive():
        raise CLIUsageError(
            f"{str(run_dir)!r}: the run that started its Ray is still running (pid {session.driver_pid}); "
            "stop it with Ctrl-C, which stops its Ray too"
        )
    stopped = stop_leftovers(run_dir)
    typer.echo(f"stopped {len(stopped)} process(es) of the run's Ray session {session.session_dir}")
    for process in stopped:
        typer.echo(f"  {process}")
