"""``eo`` commands read a pipeline's Airflow connections themselves: a Pipeline with
``kafka_conn_id`` / ``ledger_conn_id`` and no bootstrap server or ledger URL of its own is
planned by ``eo plan`` from ``AIRFLOW_CONN_*`` variables (the source's offsets read through
the Kafka connection, the checkpoint recorded in the ledger the ledger connection names);
without them the command names the missing connection and where it may come from, and
writes nothing. (Every ``eo`` command loads its pipeline the same way; the prepare and
commit through connections run end to end in the Airflow tests.)"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from eo_harness import parse_json_line

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(300)]

EO = str(Path(sys.executable).parent / "eo")


def _eo(pipeline: Any, home: Path, *args: str, **conns: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        EO_TEST_PIPELINE_JSON=pipeline.to_json(),
        AIRFLOW_HOME=str(home),
        **{f"AIRFLOW_CONN_{k.upper()}": v for k, v in conns.items()},
    )
    return subprocess.run(
        [EO, *args, "eo_test_pipelines:from_env", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_plan_from_connections_alone(harness: Any, tmp_path: Path) -> None:
    h = harness()
    h.produce(300)
    by_conn = dataclasses.replace(
        h.pipeline,
        kafka={},
        kafka_conn_id="eo_cli_kafka",
        ledger_url="sqlite:////nonexistent/not-this-one.db",
        ledger_conn_id="eo_cli_ledger",
    )
    home = tmp_path / "airflow-home"

    missing = _eo(by_conn, home, "plan")
    assert missing.returncode != 0
    assert "'eo_cli_kafka' is not defined" in missing.stderr and "AIRFLOW_CONN_EO_CLI_KAFKA" in missing.stderr
    assert h.pipeline.name not in [p.name for p in h.ledger.list_pipelines()]

    kafka_conn = json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": h.config["bootstrap.servers"]}}
    )
    ledger_conn = json.dumps(
        {"conn_type": "eo_ledger", "host": h.pipeline.ledger_url.removeprefix("sqlite:///")}
    )
    done = _eo(by_conn, home, "plan", eo_cli_kafka=kafka_conn, eo_cli_ledger=ledger_conn)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = parse_json_line(done.stdout)
    (cp,) = h.ledger.list_checkpoints(h.pipeline.name)
    assert cp.state.value == "PLANNED" and summary["checkpoint_id"] == cp.checkpoint_id, summary
    assert sum(r.end - r.start for r in cp.ranges) == 300  # every source offset, read via the connection
