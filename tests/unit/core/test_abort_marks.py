"""The abort marks' spelling (core/abort_marks.py, names.py): checkpoint ids as ranges in the
offset metadata, bounded, and read only for this ledger's identity."""

from __future__ import annotations

import pytest

from airflow_provider_eo import names
from airflow_provider_eo.core import abort_marks


@pytest.mark.parametrize(
    ("ids", "text"),
    [(set(), ""), ({4}, "4"), ({4, 7, 8, 9}, "4,7-9"), ({1, 2, 3, 10, 12, 13}, "1-3,10,12-13")],
)
def test_ids_as_ranges_and_back(ids: set[int], text: str) -> None:
    assert abort_marks.format_ids(ids) == text
    assert abort_marks.parse_ids(text) == ids


def test_a_mark_keeps_the_newest_ids_within_the_metadata_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(abort_marks, "MAX_MARK_CHARS", 10)
    assert abort_marks._bounded({1, 3, 5, 7, 9, 11, 13}) == "7,9,11,13"


def test_the_metadata_names_the_identity() -> None:
    text = names.abort_mark_metadata("a1b2", "4,7-9")
    assert text == "eoab1:a1b2:4,7-9"
    assert names.parse_abort_mark(text) == ("a1b2", "4,7-9")
    assert names.parse_abort_mark(names.marker_metadata("a1b2")) is None  # a commit marker
    assert names.parse_abort_mark("") is None and names.parse_abort_mark(None) is None


class Marks:
    def __init__(self, found: dict[tuple[str, int], tuple[int, str]]) -> None:
        self.found = found
        self.groups: list[str] = []

    def committed_marks(
        self, group: str, partitions: list[tuple[str, int]]
    ) -> dict[tuple[str, int], tuple[int, str]]:
        self.groups.append(group)
        return {tp: self.found[tp] for tp in partitions if tp in self.found}


def test_only_this_identitys_mark_counts() -> None:
    clients = Marks({("out", 0): (9, "eoab1:mine:4,9"), ("out", 1): (9, "eoab1:theirs:4,9")})
    read = {
        shard: abort_marks.aborted_checkpoints(
            clients,  # type: ignore[arg-type]
            pipeline="orders",
            identity="mine",
            sink_topic="out",
            shard=shard,
        )
        for shard in (0, 1, 2)
    }
    assert read == {0: {4, 9}, 1: set(), 2: set()}
    assert set(clients.groups) == {"eo-aborted.orders"}
