"""Library logs (transformers, vLLM, Ray, torch, ...) and Python warnings, kept off the console.

A live display redraws its lines in place, and a library that logs to the console in between
breaks it. `EngineLogs` holds every such record in memory from the moment it is entered (the input
checks load a tokenizer, which may warn), and `to_file(path)` writes the held records and every
later one to the run folder's ``engines.log`` once that folder exists. When the run never gets a
folder (a refused input), the held records are dropped with it: the error says what went wrong.
Our own lines are not logging records (the CLI prints them), so the console keeps them.

Caught: records of Python `logging` in this process from any logger outside ``entrepot``
(libraries that install their own console handler, like transformers and torch, lose it while
the block runs; a logger a library makes once the block runs is a `_Routed` one, which hands its
records to the block's handler whatever handlers the library gives it), `warnings.warn` (through
`logging.captureWarnings`), vLLM's records here and in the processes it starts
(``VLLM_CONFIGURE_LOGGING=0`` stops vLLM installing its own handler), and the Hugging Face progress
bars (``HF_HUB_DISABLE_PROGRESS_BARS=1``: transformers' "Loading weights"); either variable set by
the user is left as it is.
Not caught: text written with ``print`` or tqdm, C/C++ output on file descriptors 1 and 2
(NCCL, gloo, CUDA), and what Ray workers log (Ray starts them with ``log_to_driver=False``: their
output stays in Ray's session folder).
"""

from __future__ import annotations

import logging
import logging.handlers
import os
from pathlib import Path
from types import TracebackType

__all__ = ["ENGINE_LOG", "EngineLogs"]

ENGINE_LOG = "engines.log"
_OURS = "entrepot"
_HELD = 10_000  # records held before the run folder exists; a check that logs more keeps the newest
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Read when the library is imported, here and in the processes it starts.
_QUIET_ENV = {"VLLM_CONFIGURE_LOGGING": "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


class _Held(logging.handlers.BufferingHandler):
    """Holds the newest `capacity` records until a file takes them (never flushes on its own)."""

    def shouldFlush(self, record: logging.LogRecord) -> bool:
        if len(self.buffer) > self.capacity:
            del self.buffer[0]
        return False


_sink: logging.Handler | None = None  # where `_Routed` loggers send their records; None: as usual


class _Routed(logging.Logger):
    """The class of loggers made while `EngineLogs` runs: their records go to its handler only."""

    def callHandlers(self, record: logging.LogRecord) -> None:
        if _sink is None or self.name == _OURS or self.name.startswith(_OURS + "."):
            super().callHandlers(record)
        elif record.levelno >= _sink.level:
            _sink.handle(record)


def _route_to(handler: logging.Handler | None) -> None:
    global _sink
    _sink = handler


class EngineLogs:
    """Context manager: library log records and warnings go to memory, then to `to_file`'s file.

    On exit the loggers, their console handlers, the warnings hook and the environment are put back
    as they were.
    """

    def __init__(self) -> None:
        self._held = _Held(_HELD)
        self._file: logging.FileHandler | None = None
        self._saved_root: tuple[list[logging.Handler], int] | None = None
        self._adopted: dict[str, tuple[list[logging.Handler], bool]] = {}
        self._saved_env: dict[str, str | None] = {}
        self._saved_class: type[logging.Logger] = logging.Logger

    def __enter__(self) -> EngineLogs:
        for name, value in _QUIET_ENV.items():
            self._saved_env[name] = os.environ.get(name)
            os.environ.setdefault(name, value)
        root = logging.getLogger()
        self._saved_root = (root.handlers[:], root.level)
        root.handlers = [self._held]
        root.setLevel(logging.INFO)
        logging.captureWarnings(True)
        self._adopt_library_loggers()
        self._saved_class = logging.getLoggerClass()
        logging.setLoggerClass(_Routed)  # the loggers of libraries imported from now on
        _route_to(self._held)
        return self

    def to_file(self, path: str | Path) -> None:
        """Write the held records, then every later one, to `path` (appending: a resumed run's too)."""
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter(_FORMAT))
        for record in self._held.buffer:
            handler.handle(record)
        self._held.buffer.clear()
        root = logging.getLogger()
        root.handlers = [handler]
        self._file = handler
        _route_to(handler)
        self._adopt_library_loggers()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _route_to(None)
        logging.setLoggerClass(self._saved_class)
        logging.captureWarnings(False)
        root = logging.getLogger()
        if self._saved_root is not None:
            root.handlers, level = self._saved_root
            root.setLevel(level)
        for name, (handlers, propagate) in self._adopted.items():
            logger = logging.getLogger(name)
            logger.handlers, logger.propagate = handlers, propagate
        self._adopted.clear()
        if self._file is not None:
            self._file.close()
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def _adopt_library_loggers(self) -> None:
        """Route the libraries that print their own records to the console (propagate=False) to ours."""
        for name, logger in list(logging.Logger.manager.loggerDict.items()):
            if not isinstance(logger, logging.Logger) or name in self._adopted:
                continue
            if name == _OURS or name.startswith(_OURS + "."):
                continue
            consoles = [h for h in logger.handlers if _is_console(h)]
            if consoles or not logger.propagate:
                self._adopted[name] = (logger.handlers[:], logger.propagate)
                logger.handlers = [h for h in logger.handlers if not _is_console(h)]
                logger.propagate = True


def _is_console(handler: logging.Handler) -> bool:
    """A handler that writes to the terminal (stdout or stderr), not to a file."""
    return isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
