"""The Structured Streaming example of docs/structured-streaming.md, run as the page gives
it: its sinks module and application copied out of the page (only the broker, folders and
names replaced), the application spark-submitted with the Kafka connector, and the page's
``eo`` commands run against it. The sink is compared with a recount of the source."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from eo_harness import wait_for, with_group_gone

from airflow_provider_eo.kafka.audit import read_sink
from airflow_provider_eo.ledger import CheckpointState, Ledger

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "structured-streaming.md"


def page_blocks() -> tuple[str, str, list[str]]:
    """The page's sinks module, its application and the ``eo`` commands of its first
    shell block (comments dropped)."""
    text = PAGE.read_text()
    blocks = re.findall(r"```(\w+)\n(.*?)```", text, flags=re.S)
    python = [body for lang, body in blocks if lang == "python"]
    shell = next(body for lang, body in blocks if lang == "bash")
    commands = [line.split("#", 1)[0].strip() for line in shell.splitlines()]
    return python[0], python[1], [c for c in commands if c.startswith("eo ")]


def test_the_documented_example_runs_exactly_once(
    tmp_path: Path, kafka_config: dict[str, Any], make_topic: Callable[..., str]
) -> None:
    from airflow_provider_eo.stack.maven import cached_spark_kafka_jars, installed_spark_version

    sinks, app, commands = page_blocks()
    assert "KafkaExactlyOnceSink(" in sinks and ".start(" in app and commands, "the page's example changed"
    bootstrap = kafka_config["bootstrap.servers"]
    name = f"orders_agg_{uuid.uuid4().hex[:6]}"
    source = make_topic("orders", partitions=2)
    sink_topic = make_topic("orders-agg", partitions=2)  # it exists, as the page assumes

    def adapt(code: str) -> str:
        code = code.replace("localhost:9092", bootstrap)
        code = code.replace("/shared/eo-staging", str(tmp_path / "staging"))
        code = code.replace("/shared/ckpt/orders_agg", str(tmp_path / "ckpt"))
        code = code.replace('"orders"', repr(source))
        code = code.replace('sink_topic="orders_agg"', f"sink_topic={sink_topic!r}")
        return code.replace("orders_agg", name)

    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "sinks.py").write_text(adapt(sinks))
    (tmp_path / "orders_agg.py").write_text(adapt(app))
    run_id = f"readme-{uuid.uuid4().hex[:8]}"  # EO_STREAM_RUN_ID names the query's run
    home = tmp_path / "eo-home"  # relative SQLite ledger URLs resolve against it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "EO_HOME": str(home)}
    env.pop("EO_FAULT", None)
    query_env = {**env, "EO_STREAM_RUN_ID": run_id}

    def produce(n: int, start: int) -> None:
        producer = Producer(kafka_config)
        for i in range(start, start + n):
            producer.produce(source, key=f"k{i % 7}", value=f"order-{i}", partition=i % 2)
        assert producer.flush(30) == 0

    def eo(command: str) -> subprocess.CompletedProcess[str]:
        args = shlex.split(adapt(command))[1:]
        done = subprocess.run(
            [sys.executable, "-m", "airflow_provider_eo.cli", *args],
            cwd=tmp_path,
            env={**env, "COLUMNS": "200"},  # the table's states unabridged
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done

    ledger_url = f"sqlite:///{home / 'ledger.db'}"  # the page's

    def committed() -> list[Any]:
        if not (home / "ledger.db").exists():
            return []
        with Ledger(ledger_url) as ledger:
            try:
                checkpoints = ledger.list_checkpoints(name)
            except Exception:  # not registered yet
                return []
        return [c for c in checkpoints if c.state is CheckpointState.COMMITTED]

    def records_in(batches: list[Any]) -> int:
        return sum(r.end - r.start for c in batches for r in c.ranges)

    produce(60, 0)
    spark_submit = Path(__import__("pyspark").__file__).parent / "bin" / "spark-submit"
    jars = cached_spark_kafka_jars(installed_spark_version())
    assert jars, "the Kafka connector jars (scripts/bootstrap.sh fetches them)"
    log = tmp_path / "app.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(spark_submit),
                *("--master", "local[2]", "--jars", ",".join(map(str, jars))),
                *("--conf", "spark.sql.shuffle.partitions=4"),  # 200 state stores take ~25 s a batch here
                "orders_agg.py",
            ],
            cwd=tmp_path,
            env=query_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: records_in(committed()) == 60 or proc.poll() is not None, "the first batch", 240)
        assert proc.poll() is None, log.read_text()[-4000:]
        produce(45, 60)  # a second batch while the query runs
        wait_for(lambda: records_in(committed()) == 105 or proc.poll() is not None, "the second batch", 120)
        assert proc.poll() is None, log.read_text()[-4000:]

        listed = eo(commands[0]).stdout  # eo checkpoints NAME
        batch_lines = [line for line in listed.splitlines() if "COMMITTED" in line]
        assert len(batch_lines) == len(committed()) >= 2, listed
        eo(commands[1])  # eo audit: exits 0 only when every batch is in the sink exactly once
        eo(commands[2])  # eo stream-stop: the query stops after its batch in progress
        assert proc.wait(timeout=120) == 0, log.read_text()[-4000:]
        doctor = eo(commands[3]).stdout  # eo doctor: exits 0 when nothing is wrong
        assert "query-run" in doctor and "ENDED" in doctor, doctor
    finally:
        with_group_gone(proc)

    # Each running count per key once, and the last count per key = a recount of the source.
    values = [m.value().decode() for m in read_sink(kafka_config, sink_topic)]
    assert len(values) == len(set(values)), Counter(values).most_common(3)
    last: dict[str, int] = {}
    for value in values:
        key, _, count = value.partition("=")
        last[key] = max(last.get(key, 0), int(count))
    assert last == dict(Counter(f"k{i % 7}" for i in range(105)))
    with Ledger(ledger_url) as ledger:
        run = ledger.get_stream_run(run_id)
    assert (run.pipeline, run.state) == (name, "ENDED"), run
