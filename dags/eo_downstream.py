"""Example: a DAG run for each committed checkpoint of the example pipeline.

``dags/eo_pipeline.py`` gives its commit task the pipeline's sink topic as an outlet; every
checkpoint it commits is an asset event on ``kafka://<bootstrap>/<sink topic>`` whose
``extra`` names the checkpoint. Checkpoints a stream of ``dags/eo_stream.py`` commits itself
are events on the same asset too, from its watcher (``stream_commits=True``), with the same
checkpoint under ``extra["payload"]``; ``event_checkpoint`` reads either. This DAG is
scheduled on that asset: its task reads the events that triggered the run (several when
checkpoints commit faster than runs start) and logs each checkpoint's id, records and
source ranges. A real consumer would read the new output here; it keys its work on
``(pipeline, checkpoint_id)``, since Airflow delivers an event at least once (a commit
task that succeeds again for a COMMITTED checkpoint announces it again, with
``already_committed`` true).

The asset is built while this file is parsed, from the same pipeline and environment as
the pipeline DAG (``EO_KAFKA_BOOTSTRAP``, ``EO_DEMO_SINK_TOPIC``: see
``eo_demo_pipelines.py``); no connection is read. With only ``EO_KAFKA_CONN_ID`` set,
also set ``EO_KAFKA_BOOTSTRAP`` (the connection still wins for the Kafka clients).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task

from airflow_provider_eo.assets import event_checkpoint, sink_asset

#: What eo_pipeline.py's commit task emits to (the same pipeline, so the same asset), built
#: as every DAG file naming it builds it: with the watcher of stream-committed checkpoints.
SINK = sink_asset("eo_demo_pipelines:demo_pipeline", stream_commits=True)

with DAG(
    dag_id="eo_downstream",
    schedule=[SINK],
    start_date=datetime(2025, 1, 1),
    catchup=False,
    tags=["eo", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def new_checkpoints(*, triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """Log each committed checkpoint that triggered this run; return their ids."""
        seen = []
        for event in (triggering_asset_events or {}).get(SINK, []):
            extra = event_checkpoint(event.extra)
            if not extra:
                print(f"an event without a checkpoint: {event.extra}")
                continue
            print(
                f"pipeline {extra.get('pipeline')}: checkpoint {extra.get('checkpoint_id')} committed "
                f"{extra.get('records')} records to {extra.get('sink_topic')} from "
                + ", ".join(
                    f"{r['topic']}[{r['partition']}]:{r['start']}-{r['end']}" for r in extra.get("ranges", [])
                )
                + (" (announced again)" if extra.get("already_committed") else "")
            )
            seen.append({"pipeline": extra.get("pipeline"), "checkpoint_id": extra.get("checkpoint_id")})
        return seen

    new_checkpoints()
