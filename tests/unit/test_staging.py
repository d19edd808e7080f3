"""Manifest round trip and verification against real Parquet files."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_provider_eo import staging
from airflow_provider_eo.errors import StagingError


def _attempt(tmp_path: Path) -> str:
    for part, rows in ((0, 3), (2, 5)):
        folder = tmp_path / "data" / f"sink_partition={part}"
        folder.mkdir(parents=True)
        table = pa.table({"value": [b"v%d" % i for i in range(rows)]})
        pq.write_table(table, folder / "part-00000.parquet")
    return str(tmp_path)


def _manifest(path: str) -> staging.Manifest:
    files = staging.describe_attempt(path)
    return staging.Manifest("p", 4, "a1", "sink", 3, files, records_read=8, ranges=[])


def test_manifest_round_trip_and_counts(tmp_path: Path) -> None:
    path = _attempt(tmp_path)
    manifest = _manifest(path)
    assert manifest.partition_counts() == {0: 3, 2: 5}
    staging.write_manifest(path, manifest)
    again = staging.read_manifest(path)
    assert again == manifest and again.records == 8
    staging.verify(path, again)


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    path = _attempt(tmp_path)
    manifest = _manifest(path)
    victim = next((tmp_path / "data").rglob("*.parquet"))
    victim.write_bytes(victim.read_bytes()[:-10])
    with pytest.raises(StagingError, match=r"checkpoint 4 of pipeline .p.: staged file .* does not match"):
        staging.verify(path, manifest)


def test_missing_file_and_manifest_are_refused(tmp_path: Path) -> None:
    path = _attempt(tmp_path)
    manifest = _manifest(path)
    next((tmp_path / "data").rglob("*.parquet")).unlink()
    with pytest.raises(StagingError, match="is missing"):
        staging.verify(path, manifest)
    from airflow_provider_eo.errors import StagingNotVisible

    with pytest.raises(StagingNotVisible, match=r"manifest of .* is not visible from this process") as absent:
        staging.read_manifest(str(tmp_path / "nowhere"))
    assert not isinstance(absent.value, StagingError)  # absent is not corrupt: nothing aborts


def test_cleanup_removes_this_ledgers_attempts_only(tmp_path: Path) -> None:
    """A committed checkpoint's folder: the recorded attempt, a killed attempt (no manifest)
    and an older attempt of this ledger go; an attempt a same-name deployment with another
    ledger staged beside them (shared staging_dir) stays, and so does the folder."""
    import dataclasses

    cp_dir = tmp_path / "orders" / "cp-0000000007"
    paths = {name: str(cp_dir / f"attempt-{name}") for name in ("recorded", "killed", "ours", "theirs")}
    for name, path in paths.items():
        Path(path).mkdir(parents=True)
        _attempt(Path(path))
        if name in ("ours", "theirs"):
            owner = "our-identity" if name == "ours" else "their-identity"
            staging.write_manifest(path, dataclasses.replace(_manifest(path), identity=owner))
    staging.remove_checkpoint_attempts(str(cp_dir), "our-identity", paths["recorded"])
    assert sorted(p.name for p in cp_dir.iterdir()) == ["attempt-theirs"]
    staging.read_manifest(paths["theirs"])  # intact

    staging.remove_checkpoint_attempts(str(cp_dir), "their-identity", None)
    assert not cp_dir.exists()


def test_source_positions_counts_each_position_once_across_files(tmp_path: Path) -> None:
    """Outputs of one source record in two sink partitions count once; records without a
    position (made by the transform) not at all; the same offset of another partition or
    topic is another position."""
    rows = {
        0: [("t", 0, 5), ("t", 0, 6), (None, None, None)],
        1: [("t", 0, 5), ("t", 1, 5), ("u", 0, 5), ("t", 0, 6)],
    }
    for partition, positions in rows.items():
        folder = tmp_path / "a1" / "data" / f"sink_partition={partition}"
        folder.mkdir(parents=True)
        table = pa.table(
            {
                "value": [b"v"] * len(positions),
                "src_topic": pa.array([p[0] for p in positions], pa.string()),
                "src_partition": pa.array([p[1] for p in positions], pa.int32()),
                "src_offset": pa.array([p[2] for p in positions], pa.int64()),
            }
        )
        pq.write_table(table, folder / "part-00000.parquet")
    path = str(tmp_path / "a1")
    assert staging.source_positions(path, staging.describe_attempt(path)) == 4
    assert staging.source_positions(path, {}) == 0
