"""The command lines of the prepare and commit applications, as objects.

The operator that submits an application builds its arguments with :meth:`to_argv`
(``configure_submit`` then appends the connection ids and ``--actor-json``); the
application reads them back with :meth:`from_argv`. One object, two ends, so the two never
drift apart (the streaming application's is
:class:`~airflow_provider_eo.core.stream_contract.StreamAppArgs`).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from airflow_provider_eo import names
from airflow_provider_eo.apps import add_connection_args
from airflow_provider_eo.ledger import Actor

__all__ = ["CommitAppArgs", "PrepareAppArgs"]


def _common(ns: argparse.Namespace) -> dict[str, Any]:
    """The fields both applications read the same way from their parsed arguments."""
    return {
        "pipeline": ns.pipeline,
        "checkpoint": ns.checkpoint,
        "actor": Actor.from_arg(ns.actor_json),
        "kafka_conn_id": ns.kafka_conn_id,
        "ledger_conn_id": ns.ledger_conn_id,
    }


@dataclass(frozen=True)
class PrepareAppArgs:
    """The prepare application's command line.

    :param pipeline: ``MODULE:ATTR`` of the pipeline.
    :param checkpoint: the checkpoint to prepare.
    :param attempt: the attempt's name (None: a fresh one).
    :param actor: who the ledger records (the Airflow task); None: this process.
    :param kafka_conn_id: an Airflow ``kafka`` connection given to the operator (its id).
    :param ledger_conn_id: the same for the ledger's connection.
    :param backfill_sink_topic: the checkpoint is one of the pipeline's backfill into this topic.
    :param backfill_transform: that backfill's transform ``MOD:FN`` (None: the pipeline's).
    """

    pipeline: str
    checkpoint: int
    attempt: str | None = None
    actor: Actor | None = None
    kafka_conn_id: str | None = None
    ledger_conn_id: str | None = None
    backfill_sink_topic: str | None = None
    backfill_transform: str | None = None

    def to_argv(self) -> list[str]:
        """``--pipeline``, ``--checkpoint``, then the backfill's and the rest only when set
        (the operators leave the connection ids and the actor to ``configure_submit``)."""
        argv = ["--pipeline", self.pipeline, "--checkpoint", str(int(self.checkpoint))]
        if self.attempt is not None:
            argv += ["--attempt", self.attempt]
        if self.backfill_sink_topic is not None:
            argv += ["--backfill-sink-topic", self.backfill_sink_topic]
        if self.backfill_transform is not None:
            argv += ["--backfill-transform", self.backfill_transform]
        argv += _tail(self.kafka_conn_id, self.ledger_conn_id, self.actor)
        return argv

    @classmethod
    def from_argv(
        cls, argv: Sequence[str] | None = None, *, description: str | None = None
    ) -> PrepareAppArgs:
        """Parse the application's arguments (``sys.argv[1:]`` by default); a malformed
        command line prints the usage and exits 2, as any argparse program."""
        parser = argparse.ArgumentParser(prog=names.PREPARE_APP, description=description)
        parser.add_argument("--pipeline", required=True, help="MODULE:ATTR of the Pipeline")
        parser.add_argument("--checkpoint", type=int, required=True)
        parser.add_argument("--attempt", default=None)
        parser.add_argument("--actor-json", default=None, help="Airflow lineage for the ledger")
        add_connection_args(parser)
        parser.add_argument(
            "--backfill-sink-topic", default=None, help="prepare a checkpoint of the backfill into TOPIC"
        )
        parser.add_argument(
            "--backfill-transform",
            default=None,
            help="the backfill's transform MOD:FN (default: the pipeline's)",
        )
        ns = parser.parse_args(None if argv is None else list(argv))
        if ns.backfill_transform and not ns.backfill_sink_topic:
            parser.error("--backfill-transform needs --backfill-sink-topic")
        return cls(
            **_common(ns),
            attempt=ns.attempt,
            backfill_sink_topic=ns.backfill_sink_topic,
            backfill_transform=ns.backfill_transform,
        )


@dataclass(frozen=True)
class CommitAppArgs:
    """The commit application's command line.

    :param pipeline: ``MODULE:ATTR`` of the pipeline.
    :param checkpoint: the PREPARED checkpoint to commit.
    :param summary_file: also write the summary JSON here (client deploy mode).
    :param actor: who the ledger records (the Airflow task); None: this process.
    :param kafka_conn_id: an Airflow ``kafka`` connection given to the operator (its id).
    :param ledger_conn_id: the same for the ledger's connection.
    """

    pipeline: str
    checkpoint: int
    summary_file: str | None = None
    actor: Actor | None = None
    kafka_conn_id: str | None = None
    ledger_conn_id: str | None = None

    def to_argv(self) -> list[str]:
        """``--pipeline``, ``--checkpoint``, then the rest only when set."""
        argv = ["--pipeline", self.pipeline, "--checkpoint", str(int(self.checkpoint))]
        if self.summary_file is not None:
            argv += ["--summary-file", self.summary_file]
        argv += _tail(self.kafka_conn_id, self.ledger_conn_id, self.actor)
        return argv

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None, *, description: str | None = None) -> CommitAppArgs:
        """Parse the application's arguments (``sys.argv[1:]`` by default); a malformed
        command line prints the usage and exits 2."""
        parser = argparse.ArgumentParser(prog=names.COMMIT_APP, description=description)
        parser.add_argument("--pipeline", required=True, help="MODULE:ATTR of the Pipeline")
        parser.add_argument("--checkpoint", type=int, required=True)
        parser.add_argument("--actor-json", default=None, help="Airflow lineage for the ledger")
        add_connection_args(parser)
        parser.add_argument(
            "--summary-file", default=None, help="also write the summary JSON to this file (client mode)"
        )
        ns = parser.parse_args(None if argv is None else list(argv))
        return cls(**_common(ns), summary_file=ns.summary_file)


def _tail(kafka_conn_id: str | None, ledger_conn_id: str | None, actor: Actor | None) -> list[str]:
    argv: list[str] = []
    if kafka_conn_id is not None:
        argv += ["--kafka-conn-id", kafka_conn_id]
    if ledger_conn_id is not None:
        argv += ["--ledger-conn-id", ledger_conn_id]
    if actor is not None:
        argv += ["--actor-json", actor.to_arg()]
    return argv
