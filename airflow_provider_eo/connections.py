"""Settings that come from Airflow connections, and how they reach a Spark driver unseen.

A pipeline may name its Kafka cluster, its ledger and its S3 staging credentials by Airflow
connection (``Pipeline(kafka_conn_id=..., ledger_conn_id=..., aws_conn_id=...)``, or the same
arguments on an operator).
The process that reads the connections (an Airflow task, an ``eo`` command; the lookup is
:func:`airflow_provider_eo.hooks.base.resolve_connections`) gets a
:class:`ConnectionSettings`, and :func:`apply_settings` turns the pipeline into one with a
concrete ``kafka`` config, ``ledger_url`` and ``aws_settings`` and no connection ids left.

A Spark driver started by an Airflow task in client deploy mode gets the task's settings
through a *hand-off file*: written by the task into a fresh directory only its user can
enter (mode 0700, the file 0600), named by :data:`~airflow_provider_eo.names.CONNECTIONS_FILE_ENV`
in the driver's environment, deleted by the driver as soon as it has read it (and by the
task when spark-submit returns). Passwords therefore never appear on a command line, in an
environment variable, in Spark conf (so neither in the Spark UI's environment page nor in
the event log) or in XCom. A driver in cluster deploy mode, on another host, reads the
connections itself (Airflow's secrets backend or ``AIRFLOW_CONN_*`` there).

One exception, by necessity: Hadoop's S3A connector in a client-mode driver's JVM reads its
credentials from a credential provider, not from Python. When an ``aws_conn_id`` gives the
staging credentials, the task puts them in the environment spark-submit (and so the driver's
JVM) inherits, for the submit's duration only (:mod:`airflow_provider_eo.staging_fs`); never
in Spark conf, on a command line or in XCom.

Client settings whose values are Python callables (a Kafka connection's ``oauth_cb``
resolved by the Kafka provider, e.g. Amazon MSK IAM) travel by import path and are imported
again by the driver; anything else that is not JSON is refused with the setting named.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.errors import HandoffError as HandoffError
from airflow_provider_eo.pipeline import Pipeline

__all__ = [
    "ConnectionSettings",
    "HandoffError",
    "apply_settings",
    "read_handoff",
    "remove_handoff",
    "require_applied",
    "write_handoff",
]

_HANDOFF_NAME = "connections.json"
_CALLABLE = "__eo_callable__"


@dataclasses.dataclass(frozen=True)
class ConnectionSettings:
    """What a pipeline's connections resolved to (secrets included: never log it).

    :param kafka_conn_id: the ``kafka`` connection read, or ``None``.
    :param kafka: its client config (merged over the pipeline's ``kafka``).
    :param ledger_conn_id: the ledger connection read, or ``None``.
    :param ledger_url: its SQLAlchemy URL (replaces the pipeline's ``ledger_url``).
    :param aws_conn_id: the ``aws`` connection read for S3 staging, or ``None``.
    :param aws: its S3 settings (``access_key``, ``secret_key``, ``session_token``,
        ``region``, ``endpoint``, ``path_style``): the pipeline's ``aws_settings``.
    """

    kafka_conn_id: str | None = None
    kafka: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    ledger_conn_id: str | None = None
    ledger_url: str | None = None
    aws_conn_id: str | None = None
    aws: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.kafka_conn_id or self.ledger_conn_id or self.aws_conn_id)

    def __repr__(self) -> str:
        return (
            f"ConnectionSettings(kafka_conn_id={self.kafka_conn_id!r}, "
            f"ledger_conn_id={self.ledger_conn_id!r}, aws_conn_id={self.aws_conn_id!r})"
        )

    def to_json(self) -> str:
        """The hand-off document (callables by import path; see the module docstring)."""
        doc = {
            "kafka_conn_id": self.kafka_conn_id,
            "kafka": {k: _encode_value(self.kafka_conn_id, k, v) for k, v in self.kafka.items()},
            "ledger_conn_id": self.ledger_conn_id,
            "ledger_url": self.ledger_url,
            "aws_conn_id": self.aws_conn_id,
            "aws": dict(self.aws),
        }
        return json.dumps(doc)

    @classmethod
    def from_json(cls, text: str) -> ConnectionSettings:
        """Inverse of :meth:`to_json` (callables imported again)."""
        doc = json.loads(text)
        return cls(
            kafka_conn_id=doc.get("kafka_conn_id"),
            kafka={k: _decode_value(v) for k, v in (doc.get("kafka") or {}).items()},
            ledger_conn_id=doc.get("ledger_conn_id"),
            ledger_url=doc.get("ledger_url"),
            aws_conn_id=doc.get("aws_conn_id"),
            aws=dict(doc.get("aws") or {}),
        )


def _import_path(fn: Any) -> str | None:
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname:
        return None
    try:
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if target is fn else None


def _encode_value(conn_id: str | None, key: str, value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, functools.partial) and not value.keywords:
        path = _import_path(value.func)
        if path is not None:
            try:
                json.dumps(list(value.args))
            except TypeError:
                path = None
            else:
                return {_CALLABLE: path, "args": list(value.args)}
    elif callable(value):
        path = _import_path(value)
        if path is not None:
            return {_CALLABLE: path, "args": []}
    raise HandoffError(
        f"connection {conn_id!r}: setting {key!r} holds {type(value).__name__} {value!r}, which "
        "cannot be handed to the Spark driver; give it in the connection's extra as the dotted "
        "path of a module-level function (listed in [apache_kafka] callback_allowlist)"
    )


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict) and _CALLABLE in value:
        module, qualname = str(value[_CALLABLE]).split(":", 1)
        target: Any = importlib.import_module(module)
        for part in qualname.split("."):
            target = getattr(target, part)
        args = value.get("args") or []
        return functools.partial(target, *args) if args else target
    return value


def apply_settings(pipeline: Pipeline, settings: ConnectionSettings) -> Pipeline:
    """``pipeline`` with ``settings`` applied: the Kafka connection's config merged over its
    ``kafka`` (the connection's keys win), the ledger connection's URL as its ``ledger_url``,
    the AWS connection's S3 settings as its ``aws_settings``, and the connection ids it read
    cleared."""
    changes: dict[str, Any] = {}
    if settings.kafka_conn_id:
        changes["kafka"] = {**pipeline.kafka, **settings.kafka}
        changes["kafka_conn_id"] = None
    if settings.ledger_conn_id:
        if not settings.ledger_url:
            raise ConfigError(
                f"pipeline {pipeline.name!r}: ledger connection {settings.ledger_conn_id!r} gave no URL"
            )
        changes["ledger_url"] = settings.ledger_url
        changes["ledger_conn_id"] = None
    if settings.aws_conn_id:
        changes["aws_settings"] = {**settings.aws, "conn_id": settings.aws_conn_id}
        changes["aws_conn_id"] = None
    return dataclasses.replace(pipeline, **changes) if changes else pipeline


def require_applied(pipeline: Pipeline, *, where: str) -> None:
    """Fail with the connection named when ``pipeline`` still reads settings from Airflow
    connections that were never looked up (a caller that skipped the resolution)."""
    pending = pipeline.connection_ids
    if pending:
        named = ", ".join(f"{k}={v!r}" for k, v in pending.items())
        raise ConfigError(
            f"pipeline {pipeline.name!r}: {where} needs the settings of {named}, which were not "
            "read; resolve the pipeline with airflow_provider_eo.hooks.base.resolve_connections "
            "(the operators and eo commands do)"
        )


def write_handoff(settings: ConnectionSettings) -> Path:
    """Write ``settings`` into a fresh private directory; returns the file's path (remove it
    with :func:`remove_handoff` once the driver has ended)."""
    folder = Path(tempfile.mkdtemp(prefix="eo-conn-"))  # mode 0700
    path = folder / _HANDOFF_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(settings.to_json())
    return path


def remove_handoff(path: str | Path | None) -> None:
    """Remove a hand-off file and its directory (nothing when already gone)."""
    if path:
        shutil.rmtree(Path(path).parent, ignore_errors=True)


def read_handoff(path: str | Path) -> ConnectionSettings:
    """Read the hand-off file at ``path`` and delete it (and its directory): it is read once,
    by the driver it was written for."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise HandoffError(
            f"cannot read the connection settings handed to this driver at {file}: {exc}; in "
            "cluster deploy mode the driver reads the connections itself instead"
        ) from exc
    finally:
        remove_handoff(file)
    return ConnectionSettings.from_json(text)
