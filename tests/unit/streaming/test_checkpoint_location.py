"""A query's checkpoint location read and copied outside Spark: what a copy at batch N
holds (nothing Spark wrote for a later batch), and what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_eo.streaming.checkpoint_location import (
    CheckpointLocationError,
    copy_at_batch,
    keep_in_copy,
    read_location,
)

QUERY = "0f6c2f0e-1d41-4c55-9a51-6b0f3d7a2f10"

# A location as Spark 4 leaves it while the query runs batch 3 (offsets/3 written, commits/3
# not yet; batch 3's state version 4 being written): HDFS-backed state of one operator,
# Hadoop checksum files, a file being written, a RocksDB store's files.
FILES = [
    "metadata",
    ".metadata.crc",
    "sources/0/0",
    *(f"offsets/{n}" for n in range(4)),
    *(f"offsets/.{n}.crc" for n in range(4)),
    *(f"commits/{n}" for n in range(3)),
    "offsets/.3.5b1d.tmp",
    "state/0/_metadata/metadata",
    "state/0/_stateSchema/default/0_5c3b.schema",
    *(f"state/0/0/{v}.delta" for v in range(1, 5)),
    *(f"state/0/0/.{v}.delta.crc" for v in range(1, 5)),
    "state/0/0/2.snapshot",
    "state/0/0/5.snapshot",
    "state/1/0/3.zip",
    "state/1/0/4.changelog",
    "state/1/0/SSTs/000009-2c1e.sst",
]

AT_2 = {
    "metadata",
    ".metadata.crc",
    "sources/0/0",
    *(f"offsets/{n}" for n in range(3)),
    *(f"offsets/.{n}.crc" for n in range(3)),
    *(f"commits/{n}" for n in range(3)),
    "state/0/_metadata/metadata",
    "state/0/_stateSchema/default/0_5c3b.schema",
    *(f"state/0/0/{v}.delta" for v in range(1, 4)),
    *(f"state/0/0/.{v}.delta.crc" for v in range(1, 4)),
    "state/0/0/2.snapshot",
    "state/1/0/3.zip",
    "state/1/0/SSTs/000009-2c1e.sst",
}


def _location(root: Path) -> Path:
    for rel in FILES:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'{{"id":"{QUERY}"}}\n' if rel == "metadata" else rel)
    return root


def test_a_copy_at_batch_n_holds_the_logs_up_to_n_and_the_state_versions_up_to_n_plus_1() -> None:
    assert {rel for rel in FILES if keep_in_copy(rel, 2)} == AT_2


def test_copy_and_read_location(tmp_path: Path) -> None:
    src = _location(tmp_path / "ckpt")
    found = read_location(str(src))
    assert (found.query_id, found.latest_offsets, found.latest_commit) == (QUERY, 3, 2)
    copy = copy_at_batch(str(src), str(tmp_path / "copy"), 2)
    held = {str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*") if p.is_file()}
    assert held == AT_2
    assert (copy.query_id, copy.batch_id, copy.files) == (QUERY, 2, len(AT_2))
    assert copy.bytes == sum((src / rel).stat().st_size for rel in AT_2)
    assert (tmp_path / "copy" / "state/0/0/3.delta").read_text() == "state/0/0/3.delta"
    again = read_location(str(tmp_path / "copy"))
    assert (again.query_id, again.latest_offsets, again.latest_commit) == (QUERY, 2, 2)


def test_copy_refuses_a_batch_spark_did_not_commit_and_a_used_destination(tmp_path: Path) -> None:
    src = _location(tmp_path / "ckpt")
    with pytest.raises(CheckpointLocationError, match=r"not committed batch 3 .*newest commit is 2"):
        copy_at_batch(str(src), str(tmp_path / "copy"), 3)
    assert not (tmp_path / "copy").exists()
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("x")
    with pytest.raises(CheckpointLocationError, match="not empty"):
        copy_at_batch(str(src), str(tmp_path / "used"), 2)
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["x"]
    with pytest.raises(CheckpointLocationError, match="no 'metadata'"):
        copy_at_batch(str(tmp_path / "used"), str(tmp_path / "copy2"), 0)
