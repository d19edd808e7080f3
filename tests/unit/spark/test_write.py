"""When the staged write must shuffle by sink partition."""

from __future__ import annotations

from airflow_provider_eo.spark import write


def test_needs_shuffle() -> None:
    assert write.needs_shuffle(None, 3)  # the transform's plan already shuffles
    assert not write.needs_shuffle(4, 3)  # 12 files: write from the source tasks
    limit = write.MAX_UNSHUFFLED_FILES
    assert not write.needs_shuffle(limit, 1)
    assert write.needs_shuffle(limit // 2 + 1, 2)  # too many small files
