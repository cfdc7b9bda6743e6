"""`user_errors`: user mistakes become one line + exit 2; bugs keep their traceback."""

from __future__ import annotations

import pytest
import typer

from entrepot.cli._errors import CLIUsageError, user_errors
from entrepot.grpo.errors import DataError


def test_user_mistakes_exit_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as raised, user_errors():
        raise CLIUsageError("--budget (0) must be\n  >= 1")
    assert raised.value.exit_code == 2
    assert capsys.readouterr().err == "error: --budget (0) must be >= 1\n"


def test_other_errors_are_not_swallowed() -> None:
    with pytest.raises(RuntimeError, match="a bug"), user_errors():
        raise RuntimeError("a bug")


def test_extra_types_are_opt_in(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(KeyError), user_errors():
        raise KeyError("not a user error here")
    with pytest.raises(typer.Exit), user_errors(KeyError):
        raise KeyError("missing column 'x'")
    assert capsys.readouterr().err == "error: missing column 'x'\n"


class _RemoteError(DataError):
    """Stands in for Ray's RayTaskError re-raised as its cause: the text holds a worker traceback."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__("ray::ActorWorker.rollout() Traceback ... File workers.py, line 1")
        self.cause = cause


def test_a_remote_error_is_reported_by_its_cause(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit), user_errors():
        raise _RemoteError(DataError("data.train_path 'x.jsonl' does not exist"))
    assert capsys.readouterr().err == "error: data.train_path 'x.jsonl' does not exist\n"
