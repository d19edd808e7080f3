"""A local ``staging_dir`` with a Spark cluster whose worker does not share it (a second
host's local disk; here the worker runs in its own mount namespace with a private tmpfs
over the staging folder). Prepare used to list nothing, commit the checkpoints with 0
records and lose them; now it refuses, commits nothing, and once the folder is shared the
pipeline catches up exactly once, audited against the source."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from eo_harness import EO
from eo_spark_standalone import StandaloneCluster

from airflow_provider_eo.kafka.audit import settled_ends
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.spark.probe import PROBE_ROWS

pytestmark = [
    pytest.mark.kafka,
    pytest.mark.spark,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("nsenter")),
        reason="a private mount namespace needs root, unshare and nsenter",
    ),
]

RECORDS = 5000

CATCH_UP = """
import json
from airflow_provider_eo.core.runner import run_once
from airflow_provider_eo.spark.stager import SparkStager
from eo_test_pipelines import from_env

pipeline, stager, records = from_env(), SparkStager(), 0
for _ in range(20):
    result = run_once(pipeline, stager=stager)
    if result.checkpoint is None:
        break
    records += result.checkpoint.records or 0
print(json.dumps({"records": records}))
"""


def _doctor_staging_finding(h: Any) -> dict[str, Any]:
    """`eo doctor --json`'s "staging shared" finding for the harness's pipeline."""
    env = {**os.environ, "EO_TEST_PIPELINE_JSON": h.pipeline.to_json()}
    proc = subprocess.run(
        [EO, "doctor", "eo_test_pipelines:from_env", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    findings = {f["check"]: f for f in json.loads(proc.stdout)["findings"]}
    return dict(findings["staging shared"])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[StandaloneCluster, Path]]:
    staging = tmp_path / "staging"
    staging.mkdir()
    standalone = StandaloneCluster(tmp_path / "spark-standalone", cores=2, memory="1g")
    standalone.up(private=(staging,))
    try:
        yield standalone, staging
    finally:
        standalone.down()


def test_staging_the_driver_cannot_see_fails_loudly_then_catches_up_exactly_once(
    harness: Callable[..., Any], cluster: tuple[StandaloneCluster, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    standalone, staging = cluster
    # `eo` prints its error wrapped at the console's width (COLUMNS, else 80): wide enough
    # that no phrase or path checked below is split, whatever the temp folder's length.
    monkeypatch.setenv("COLUMNS", "1000")
    h = harness(
        source_partitions=2,
        sink_partitions=2,
        max_records_per_checkpoint=2500,
        spark_conf={"spark.master": standalone.master_url, "spark.executor.memory": "512m"},
        # The executors write the staged files (a checkpoint below spark_commit_min_records
        # is written by the driver, which sees its own folder); the commit stays here.
        spark_commit_min_records=0,
        commit_mode="local",
    )
    h = h.with_(staging_dir=str(staging))
    h.produce(RECORDS)
    sink = [(h.pipeline.sink_topic, p) for p in (0, 1)]

    refused = h.cli("run-once")
    assert refused.returncode != 0, refused.stdout
    message = refused.stderr + refused.stdout
    assert "checkpoint 1" in message and str(staging) in message, message
    assert "shared by the Spark driver, every executor and the committer" in message, message
    (cp,) = h.ledger.list_checkpoints(h.pipeline.name)
    assert cp.state is CheckpointState.PLANNED and cp.records is None
    assert set(settled_ends(h.config, sink).values()) == {0}  # nothing published
    # `eo doctor` finds it before any run: the executors' probe rows are not visible here.
    shared = _doctor_staging_finding(h)
    assert shared["severity"] == "fail" and "sees 0" in shared["found"], shared
    assert "shared by the Spark driver, every executor and the committer" in shared["change"]

    # The folder is shared again (the worker's private mount removed): one driver process
    # runs cycles until the pipeline is caught up.
    standalone.share_again(staging)
    shared = _doctor_staging_finding(h)
    assert shared["severity"] == "ok" and f"the {PROBE_ROWS} rows" in shared["found"], shared
    env = {**os.environ, "EO_TEST_PIPELINE_JSON": h.pipeline.to_json()}
    done = subprocess.run(
        [sys.executable, "-c", CATCH_UP], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"records": RECORDS}
    report = h.assert_exactly_once(expected_records=RECORDS)
    assert report.source_records == RECORDS and report.dropped == 0, report.as_dict()
    assert all(c.state is CheckpointState.COMMITTED for c in h.ledger.list_checkpoints(h.pipeline.name))
