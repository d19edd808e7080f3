"""What crosses the process boundary of the streaming application (docs/design.md §8).

``EoStreamOperator`` (Airflow side) and ``eo stream`` start the application; the
application (``apps/stream.py``, a spark-submit driver) runs
:func:`~airflow_provider_eo.core.stream.run_stream`. Two objects travel between them:

- :class:`StreamAppArgs`, the application's command line: built by the starter,
  :meth:`~StreamAppArgs.to_argv` for spark-submit, :meth:`~StreamAppArgs.from_argv` in the
  driver. The flags are a stable interface: a driver started by an older operator parses.
- :class:`StreamReport`, the JSON lines the driver prints and appends to its
  ``--report-file``: one line per checkpoint, the summary on a clean exit, a failure line
  (``{"error", "traceback"}``) when it dies of an exception. Written by
  :class:`StreamReportWriter`, read by :meth:`StreamReport.parse`.

The streaming settings (commit mode, interval, heartbeat, bounds) are checked once, by
:func:`check_stream_settings`: the CLI, the operator, the driver and ``run_stream`` all
call it. Imports nothing from Spark, Airflow or the CLI.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from airflow_provider_eo.errors import StreamArgsError as StreamArgsError
from airflow_provider_eo.ledger.records import Actor

CommitMode = Literal["inline", "airflow"]
#: ``inline``: the driver commits each prepared checkpoint; ``airflow``: it only prepares.
COMMIT_MODES: tuple[CommitMode, ...] = ("inline", "airflow")
DEFAULT_INTERVAL_S = 5.0
DEFAULT_HEARTBEAT_S = 5.0
#: How many lines of the driver's traceback its failure line keeps.
TRACEBACK_LINES = 20


@dataclass(frozen=True)
class _Spelling:
    """How one caller names the settings in a message: ``interval`` or ``--interval``."""

    flags: bool

    def __call__(self, setting: str) -> str:
        return f"--{setting}" if self.flags else setting

    def modes(self) -> str:
        return ", ".join(COMMIT_MODES) if self.flags else str(COMMIT_MODES)


def _refused(describe: Callable[[_Spelling], str]) -> StreamArgsError:
    return StreamArgsError(describe(_Spelling(False)), cli_message=describe(_Spelling(True)))


def check_stream_settings(
    *,
    interval: float = DEFAULT_INTERVAL_S,
    commit: str = "inline",
    duration: float | None = None,
    checkpoints: int | None = None,
    heartbeat: float = DEFAULT_HEARTBEAT_S,
) -> None:
    """Refuse an impossible streaming setting with :class:`StreamArgsError` (the first one,
    in the order of the arguments' flags on ``eo stream``): a commit mode outside
    :data:`COMMIT_MODES`, both bounds (``duration`` and ``checkpoints``), an interval or
    heartbeat that is not > 0 seconds, fewer than 1 checkpoint."""
    if commit not in COMMIT_MODES:
        raise _refused(lambda s: f"{s('commit')} must be one of {s.modes()}, got {commit!r}")
    if duration is not None and checkpoints is not None:
        raise _refused(lambda s: f"give {s('duration')} or {s('checkpoints')}, not both")
    if interval <= 0:
        raise _refused(lambda s: f"{s('interval')} must be > 0 seconds, got {interval}")
    if heartbeat <= 0:
        raise _refused(lambda s: f"{s('heartbeat')} must be > 0 seconds, got {heartbeat}")
    if checkpoints is not None and checkpoints < 1:
        raise _refused(lambda s: f"{s('checkpoints')} must be >= 1, got {checkpoints}")


def _parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eo-stream", description=description)
    parser.add_argument("--pipeline", required=True, help="MODULE:ATTR of the Pipeline")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S)
    parser.add_argument("--commit", choices=COMMIT_MODES, default="inline")
    bound = parser.add_mutually_exclusive_group()
    bound.add_argument("--duration", type=float, default=None)
    bound.add_argument("--checkpoints", type=int, default=None)
    parser.add_argument("--actor-json", default=None, help="Airflow lineage for the ledger")
    parser.add_argument("--report-file", default=None, help="append the JSON lines (and a failure) here too")
    parser.add_argument("--run-id", default=None, help="the run's id in the ledger (default: a fresh one)")
    parser.add_argument(
        "--heartbeat", type=float, default=DEFAULT_HEARTBEAT_S, help="seconds between the run's heartbeats"
    )
    parser.add_argument("--log-path", default=None, help="where this driver's output goes (recorded)")
    parser.add_argument("--kafka-conn-id", default=None, help="Airflow kafka connection of the pipeline")
    parser.add_argument("--ledger-conn-id", default=None, help="Airflow connection of the ledger")
    return parser


def _option(flag: str, value: str) -> list[str]:
    # A value that starts with "-" (a negative number, an odd path) would read as a flag.
    return [f"{flag}={value}"] if value.startswith("-") else [flag, value]


@dataclass(frozen=True)
class StreamAppArgs:
    """The streaming application's command line, as one object.

    :param pipeline: ``MODULE:ATTR`` of the pipeline.
    :param interval: seconds between checkpoints.
    :param commit: ``inline`` (the driver commits) or ``airflow`` (it only prepares).
    :param duration: stop cleanly after this many seconds (or ``checkpoints``, not both).
    :param checkpoints: stop cleanly after this many checkpoints (resumed ones count).
    :param actor: who the ledger records as moving the checkpoints (the Airflow task);
        ``None``: this process. ``EoStreamOperator`` leaves it to ``configure_submit``,
        which appends the task's ``--actor-json``.
    :param report_file: the driver appends its :class:`StreamReport` lines here too.
    :param run_id: the run's id in the ledger (``None``: a fresh one).
    :param heartbeat: seconds between the run's heartbeats in the ledger.
    :param log_path: where the driver's output goes (recorded on the run's row).
    :param kafka_conn_id: an Airflow ``kafka`` connection given to the operator (its id only;
        the settings reach the driver as :mod:`airflow_provider_eo.connections` says).
    :param ledger_conn_id: the same for the ledger's connection.
    """

    pipeline: str
    interval: float = DEFAULT_INTERVAL_S
    commit: CommitMode = "inline"
    duration: float | None = None
    checkpoints: int | None = None
    actor: Actor | None = None
    report_file: str | None = None
    run_id: str | None = None
    heartbeat: float = DEFAULT_HEARTBEAT_S
    log_path: str | None = None
    kafka_conn_id: str | None = None
    ledger_conn_id: str | None = None

    def validate(self) -> StreamAppArgs:
        """``self``, or :class:`StreamArgsError` naming the impossible setting."""
        check_stream_settings(
            interval=self.interval,
            commit=self.commit,
            duration=self.duration,
            checkpoints=self.checkpoints,
            heartbeat=self.heartbeat,
        )
        return self

    def to_argv(self) -> list[str]:
        """The application's arguments; :meth:`from_argv` reads them back to an equal object.

        ``--pipeline``, ``--interval`` and ``--commit`` always; the rest only when set
        (``--heartbeat`` when not the default).
        """
        argv = _option("--pipeline", self.pipeline) + _option("--interval", repr(float(self.interval)))
        argv += _option("--commit", self.commit)
        if self.duration is not None:
            argv += _option("--duration", repr(float(self.duration)))
        if self.checkpoints is not None:
            argv += _option("--checkpoints", str(int(self.checkpoints)))
        if self.report_file is not None:
            argv += _option("--report-file", self.report_file)
        if self.run_id is not None:
            argv += _option("--run-id", self.run_id)
        if self.heartbeat != DEFAULT_HEARTBEAT_S:
            argv += _option("--heartbeat", repr(float(self.heartbeat)))
        if self.log_path is not None:
            argv += _option("--log-path", self.log_path)
        if self.actor is not None:
            argv += _option("--actor-json", self.actor.to_arg())
        if self.kafka_conn_id is not None:
            argv += _option("--kafka-conn-id", self.kafka_conn_id)
        if self.ledger_conn_id is not None:
            argv += _option("--ledger-conn-id", self.ledger_conn_id)
        return argv

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None, *, description: str | None = None) -> StreamAppArgs:
        """Parse the application's arguments (``sys.argv[1:]`` by default), not validated
        (:meth:`validate`). A malformed command line (unknown flag, a missing
        ``--pipeline``, an unknown ``--commit``, both bounds) prints the usage and exits 2,
        as any argparse program; ``description`` heads ``--help``."""
        ns = _parser(description).parse_args(None if argv is None else list(argv))
        return cls(
            pipeline=ns.pipeline,
            interval=ns.interval,
            commit=ns.commit,
            duration=ns.duration,
            checkpoints=ns.checkpoints,
            actor=Actor.from_arg(ns.actor_json),
            report_file=ns.report_file,
            run_id=ns.run_id,
            heartbeat=ns.heartbeat,
            log_path=ns.log_path,
            kafka_conn_id=ns.kafka_conn_id,
            ledger_conn_id=ns.ledger_conn_id,
        )


@dataclass(frozen=True)
class StreamFailure:
    """The driver's failure line: its exception (``error``: ``Type: message``) and the last
    :data:`TRACEBACK_LINES` lines of its traceback."""

    error: str
    traceback: tuple[str, ...] = ()

    @classmethod
    def of(cls, exc: BaseException) -> StreamFailure:
        """The failure line for ``exc``."""
        lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).splitlines()
        return cls(f"{type(exc).__name__}: {exc}", tuple(lines[-TRACEBACK_LINES:]))

    def as_dict(self) -> dict[str, Any]:
        """The JSON line: ``{"error": ..., "traceback": [...]}``."""
        return {"error": self.error, "traceback": list(self.traceback)}


def _is_summary(value: dict[str, Any]) -> bool:
    # A checkpoint's line has "checkpoint" (its id); only the summary counts "checkpoints".
    return "checkpoints" in value and "records" in value


@dataclass(frozen=True)
class StreamReport:
    """What the driver reported, read back from its JSON lines.

    :param checkpoints: each checkpoint's line, in order (``StreamCheckpoint.summary()``).
    :param summary: the exit summary (``StreamResult.summary()``), ``None`` when the driver
        did not end cleanly.
    :param failure: the failure line, ``None`` when the driver did not report one.
    """

    checkpoints: tuple[dict[str, Any], ...] = ()
    summary: dict[str, Any] | None = None
    failure: StreamFailure | None = None

    @classmethod
    def parse(cls, lines: Iterable[str]) -> StreamReport:
        """Read the report from ``lines``; other lines (a driver's stdout has log lines) and
        a line a kill cut short are skipped. The last summary and the last failure line win."""
        checkpoints: list[dict[str, Any]] = []
        summary: dict[str, Any] | None = None
        failure: StreamFailure | None = None
        for line in lines:
            text = line.strip()
            if not text.startswith("{"):  # only an object's JSON starts with "{"
                continue
            try:
                value = json.loads(text)
            except ValueError:  # a line cut by a SIGKILL
                continue
            if "error" in value:
                failure = StreamFailure(str(value["error"]), tuple(value.get("traceback") or ()))
            elif _is_summary(value):
                summary = value
            elif "checkpoint" in value:
                checkpoints.append(value)
        return cls(tuple(checkpoints), summary, failure)

    @classmethod
    def read(cls, path: Path | None) -> StreamReport:
        """:meth:`parse` the report file at ``path``; empty when there is none."""
        if path is None or not path.exists():
            return cls()
        return cls.parse(path.read_text(errors="replace").splitlines())

    def lines(self) -> list[str]:
        """The report as the JSON lines :class:`StreamReportWriter` writes."""
        values = [*self.checkpoints, *([self.summary] if self.summary is not None else [])]
        if self.failure is not None:
            values.append(self.failure.as_dict())
        return [json.dumps(v) for v in values]


class StreamReportWriter:
    """Writes the driver's report: each line to stdout and, when ``path`` is given, appended
    to that file (flushed per line, so a kill loses at most the line being written)."""

    def __init__(self, path: str | None, *, out: IO[str] | None = None) -> None:
        self.path = path
        self._out = out
        self._file: IO[str] | None = open(path, "a") if path else None  # noqa: SIM115

    def _line(self, value: dict[str, Any]) -> None:
        text = json.dumps(value)
        print(text, file=self._out or sys.stdout, flush=True)
        if self._file is not None:
            self._file.write(text + "\n")
            self._file.flush()

    def checkpoint(self, line: dict[str, Any]) -> None:
        """One checkpoint's line (``StreamCheckpoint.summary()``)."""
        self._line(line)

    def summary(self, summary: dict[str, Any]) -> None:
        """The exit summary (``StreamResult.summary()``); must count ``checkpoints`` and
        ``records``, which is how :meth:`StreamReport.parse` tells it from a checkpoint's line."""
        if not _is_summary(summary):
            raise ValueError(f"a stream summary counts checkpoints and records, got {sorted(summary)}")
        self._line(summary)

    def failure(self, failure: StreamFailure) -> None:
        """The failure line."""
        self._line(failure.as_dict())

    def close(self) -> None:
        """Close the report file."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> StreamReportWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
