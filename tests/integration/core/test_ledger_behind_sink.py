"""A ledger that cannot be fooled: restored from an older copy, or re-created after its
commit markers expired, it refuses to plan instead of re-issuing checkpoints the sink
already holds (loss) or republishing the retained log (duplicates)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from eo_harness import Harness

from airflow_provider_eo import names
from airflow_provider_eo.errors import ForeignOutputInSink, LedgerBehindSink
from airflow_provider_eo.kafka.audit import settled_ends
from airflow_provider_eo.ledger import CheckpointState
from airflow_provider_eo.pipeline import Startup

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def _copy(src: Path, dst: Path) -> None:
    """The sqlite3 backup API: a consistent copy of a live WAL database."""
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    a.close()
    b.close()


def _ledger_file(h: Harness) -> Path:
    return Path(h.pipeline.ledger_url.removeprefix("sqlite:///"))


def _sink_ends(h: Harness) -> dict[tuple[str, int], int]:
    return settled_ends(h.config, [(h.pipeline.sink_topic, p) for p in (0, 1)])


def test_a_ledger_restored_from_an_older_copy_refuses_to_run(
    harness: Callable[..., Any], tmp_path: Path
) -> None:
    """The reproduced rollback: checkpoint 1 committed, the ledger copied, checkpoints 2 and
    3 committed, the copy put back, 1,000 new records. Old code: every run exited 0 and
    1,000 of the 4,000 records never reached the sink. Now: refused, the sink untouched."""
    h = harness(source_partitions=2, sink_partitions=2, max_records_per_checkpoint=1000)
    h.produce(1000)
    assert [r.checkpoint.checkpoint_id for r in h.drain()] == [1]
    backup = tmp_path / "ledger-backup.db"
    _copy(_ledger_file(h), backup)
    h.produce(2000, start=1000)
    assert [r.checkpoint.checkpoint_id for r in h.drain()] == [2, 3]
    h.ledger.close()
    _copy(backup, _ledger_file(h))  # the restore

    restored = Harness(h.pipeline, h.config, h.spark)
    try:
        restored.produce(1000, start=3000)
        before = _sink_ends(restored)
        with pytest.raises(LedgerBehindSink) as refused:
            restored.run_once()
        text = str(refused.value)
        assert "the ledger is older than the sink" in text and "shard 0 at checkpoint 3" in text, text
        assert "highest checkpoint is 1" in text and "startup=Startup(mode='offsets'" in text, text
        cli = restored.cli("run-once")
        assert cli.returncode != 0 and "the ledger is older than the sink" in cli.stderr + cli.stdout
        assert _sink_ends(restored) == before  # nothing published
        assert [c.checkpoint_id for c in restored.ledger.list_checkpoints(h.pipeline.name)] == [1]
    finally:
        restored.ledger.close()


def _delete_marker_group(h: Harness) -> None:
    """What offsets.retention.minutes does to an idle pipeline's commit markers."""
    admin = AdminClient({"bootstrap.servers": h.config["bootstrap.servers"]})
    for future in admin.delete_consumer_groups([names.marker_group(h.pipeline)]).values():
        future.result(30)


def test_a_restored_ledger_is_refused_after_its_markers_expired(
    harness: Callable[..., Any], tmp_path: Path
) -> None:
    h = harness(source_partitions=2, sink_partitions=2, max_records_per_checkpoint=500)
    h.produce(500)
    h.drain()
    backup = tmp_path / "ledger-backup.db"
    _copy(_ledger_file(h), backup)
    h.produce(1000, start=500)
    assert len(h.drain()) == 2
    h.ledger.close()
    _copy(backup, _ledger_file(h))
    _delete_marker_group(h)
    restored = Harness(h.pipeline, h.config, h.spark)
    try:
        with pytest.raises(LedgerBehindSink, match=r"newest output holds \d+ records of checkpoints up to 3"):
            restored.run_once()
    finally:
        restored.ledger.close()


def test_a_recreated_ledger_after_the_markers_expired_refuses_to_republish(
    harness: Callable[..., Any], tmp_path: Path
) -> None:
    """An idle pipeline whose ledger was re-created once its markers expired. Old code: no
    marker, no shard row, so the startup policy replanned from the log start and published
    the retained log again (the audit called the old copy "foreign"). Now: refused, naming
    what was found; `eo reset` to where that output ends carries on exactly once."""
    h = harness(source_partitions=2, sink_partitions=2, startup=Startup(mode="earliest"))
    h.produce(600)
    h.drain()
    old_identity = h.ledger.get_pipeline(h.pipeline.name).identity
    h.ledger.close()
    for path in _ledger_file(h).parent.glob(_ledger_file(h).name + "*"):
        path.unlink()
    _delete_marker_group(h)

    fresh = Harness(h.pipeline, h.config, h.spark)
    try:
        fresh.produce(400, start=600)
        before = _sink_ends(fresh)
        with pytest.raises(ForeignOutputInSink) as refused:
            fresh.run_once()
        text = str(refused.value)
        assert f"written by ledger identity {old_identity[:8]}" in text and "600 records" in text, text
        assert "eo reset" in text and "another pipeline name" in text
        assert _sink_ends(fresh) == before
        assert fresh.ledger.list_checkpoints(h.pipeline.name) == []

        # The documented way on: reset to where the old output ends, then run.
        command = text[text.index("eo reset") :].split(";")[0]
        to = command.split("--to ", 1)[1].strip("'")
        reset = fresh.cli("reset", "--to", to)
        assert reset.returncode == 0, reset.stderr
        fresh.drain()
        report = fresh.audit()
        assert report.ok and report.foreign == 600 and report.source_records == 400, report.as_dict()
        assert all(
            c.state is CheckpointState.COMMITTED for c in fresh.ledger.list_checkpoints(h.pipeline.name)
        )
    finally:
        fresh.ledger.close()
