"""When the staged write must shuffle by sink partition."""

from __future__ import annotations

from airflow_provider_eo.spark import write


def test_needs_shuffle() -> None:
    assert write.needs_shuffle(None, 3)  # the transform's plan already shuffles
    assert not write.needs_shuffle(4, 3)  # 12 files: write from the source tasks
    limit = write.MAX_UNSHUFFLED_FILES
    assert not write.needs_shuffle(limit, 1)
    assert write.needs_shuffle(limit // 2 + 1, 2)  # too many small files


def test_unordered_tasks() -> None:
    assert write.unordered_tasks(8, 4) == 8  # the cluster's parallelism
    assert write.unordered_tasks(2, 4) == 2
    assert write.unordered_tasks(400, 16) == write.MAX_UNSHUFFLED_FILES // 16  # file cap
    assert write.unordered_tasks(4, write.MAX_UNSHUFFLED_FILES * 2) == 1  # at least one task
