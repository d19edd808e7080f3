"""What a committed checkpoint tells the DAGs scheduled on its sink asset: the ``extra`` of
its asset event, the same whoever announces it (a commit task's outlet, the backfill, or
the watcher of stream-committed checkpoints in the triggerer)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_provider_eo.ledger.records import CheckpointRecord
    from airflow_provider_eo.pipeline import Pipeline


def checkpoint_extra(
    pipeline: Pipeline,
    cp: CheckpointRecord,
    *,
    sink_topic: str | None = None,
    already_committed: bool = False,
) -> dict[str, Any]:
    """The ``extra`` of the asset event of a COMMITTED checkpoint (JSON-ready).

    ``pipeline``, ``checkpoint_id``, ``sink_topic``; ``records`` published; ``ranges``, the
    source offsets ``[start, end)`` per topic-partition it read; ``dead_letters`` sent to
    ``dead_letter_topic``; ``lineage``, the Airflow task instance the ledger records as its
    committer (``dag_id``, ``run_id``, ``task_id``, ``try_number``); ``ledger_lineage``,
    the ledger's lineage number (it changes on a restore or reset); ``committed_at``; and
    ``already_committed``, true when the emitting task found the checkpoint COMMITTED (a
    retry or re-run: an earlier event may carry the same checkpoint).

    :param pipeline: the pipeline the checkpoint belongs to.
    :param cp: the checkpoint as the ledger shows it after its commit.
    :param sink_topic: the topic it was published to, when not the pipeline's (a backfill's
        target topic).
    :param already_committed: whether this task found it COMMITTED before doing anything.
    """
    return {
        "pipeline": cp.pipeline,
        "checkpoint_id": cp.checkpoint_id,
        "sink_topic": sink_topic or pipeline.sink_topic,
        "records": cp.records,
        "ranges": [
            {
                "topic": r.topic,
                "partition": r.partition,
                "start": r.start,
                "end": r.end,
                **({"skipped_from": r.skipped_from} if r.skipped_from is not None else {}),
            }
            for r in cp.ranges
        ],
        "dead_letters": cp.dead_letters,
        "dead_letter_topic": pipeline.dead_letter_topic if pipeline.dead_letters_enabled else None,
        "lineage": {
            "dag_id": cp.dag_id,
            "run_id": cp.run_id,
            "task_id": cp.task_id,
            "try_number": cp.try_number,
        },
        "ledger_lineage": cp.lineage,
        "committed_at": cp.committed_at.isoformat() if cp.committed_at else None,
        "already_committed": already_committed,
    }


__all__ = ["checkpoint_extra"]
