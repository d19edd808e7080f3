"""Every derived name: transactional ids, marker groups, shards, staging paths, provenance."""

from __future__ import annotations

import os
import socket

import pytest

from airflow_provider_eo import names
from airflow_provider_eo.ledger import Actor
from airflow_provider_eo.pipeline import Pipeline


def _pipeline(**kw: object) -> Pipeline:
    settings: dict[str, object] = {
        "name": "orders",
        "kafka": {"bootstrap.servers": "127.0.0.1:1"},
        "source_topics": ["in"],
        "sink_topic": "out",
        "staging_dir": "/stage",
        **kw,
    }
    return Pipeline(**settings)  # type: ignore[arg-type]


def test_transactional_id_is_stable_per_shard_and_namespaced_by_prefix() -> None:
    plan = names.commit_plan(_pipeline(transactional_id_prefix="acme", commit_shards=4), 4)
    assert names.plan_transactional_id(plan, "orders", 0) == "acme.orders.0"
    assert names.plan_transactional_id(plan, "orders", 3) == "acme.orders.3"
    assert names.plan_transactional_id(plan, "orders", 3) == names.plan_transactional_id(plan, "orders", 3)
    default = names.commit_plan(_pipeline(), 1)
    assert names.plan_transactional_id(default, "orders", 0) == "eo.orders.0"


def test_lease_owner_is_one_per_process_and_airflow_try() -> None:
    here = names.lease_owner()
    assert here.startswith(names.LEASE_OWNER_PREFIX) and here == names.lease_owner()  # stable
    host, pid, tag = names.lease_owner_process(here) or ("", 0, "")
    assert (host, pid) == (socket.gethostname(), os.getpid()) and tag
    try1 = names.lease_owner(Actor(dag_id="d", run_id="r", task_id="commit", try_number=1))
    try2 = names.lease_owner(Actor(dag_id="d", run_id="r", task_id="commit", try_number=2))
    assert try1.startswith("commit:d/r/commit#1@") and len({here, try1, try2}) == 3
    # the actor's own host and pid (an Airflow worker's, handed to a Spark driver) are not
    # this process's: the owner names the process that commits
    assert names.lease_owner(Actor(hostname="worker", pid=1)) == here
    assert len(names.lease_owner(Actor(dag_id="d" * 400))) == 250  # the ledger's column
    assert names.lease_owner_process(names.lease_owner(Actor(dag_id="d" * 400)))[1] == os.getpid()  # type: ignore[index]
    assert names.lease_owner_process("eo.orders") is None  # an older release's owner
    assert names.lease_owner_process("fence:@host:12") is None


def test_a_gone_process_is_told_apart_from_a_live_one() -> None:
    import subprocess
    import sys

    from airflow_provider_eo import processes

    tag = processes.process_tag()
    assert not processes.process_gone(os.getpid(), tag)
    assert processes.process_gone(os.getpid(), tag.rsplit(".", 1)[0] + ".1")  # the pid, reused
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from airflow_provider_eo import processes as p; print(os.getpid(), p.process_tag())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    pid, child_tag = child.stdout.split()
    assert processes.process_gone(int(pid), child_tag)  # it exited
    assert not processes.process_gone(int(pid), "otherboot0000.1.1")  # cannot be judged: not gone


def test_marker_group_is_per_pipeline() -> None:
    assert names.marker_group(_pipeline()) == "eo-marker.orders"
    assert names.marker_group(_pipeline(name="other")) != names.marker_group(_pipeline())


def test_prepare_app_names() -> None:
    assert names.prepare_app_name("orders") == f"{names.PREPARE_APP}-orders"
    assert names.prepare_app_name("orders", 12) == f"{names.PREPARE_APP}-orders-12"


@pytest.mark.parametrize(
    ("commit_shards", "sink_partitions", "expected"),
    [(1, 6, 1), (3, 6, 3), (8, 6, 6), (4, 1, 1)],
)
def test_shard_count_is_capped_by_sink_partitions(
    commit_shards: int, sink_partitions: int, expected: int
) -> None:
    assert names.shard_count(_pipeline(commit_shards=commit_shards), sink_partitions) == expected


def test_shard_of_maps_every_partition_to_a_used_shard() -> None:
    p = _pipeline(commit_shards=3)
    shards = [names.shard_of(p, part, 7) for part in range(7)]
    assert shards == [0, 1, 2, 0, 1, 2, 0]
    # Each shard's marker lives on the sink partition with its number: it must publish it.
    assert all(names.shard_of(p, s, 7) == s for s in range(names.shard_count(p, 7)))
    assert {names.shard_of(_pipeline(), part, 7) for part in range(7)} == {0}


def test_staging_paths_nest_attempts_under_the_checkpoint() -> None:
    p = _pipeline()
    cp = names.checkpoint_dir(p, 42)
    assert cp == os.path.join("/stage", "orders", "cp-0000000042")
    assert names.attempt_dir(p, 42, "a1") == os.path.join(cp, "attempt-a1")
    # Zero-padded ids sort as numbers do.
    assert sorted([names.checkpoint_dir(p, 10), names.checkpoint_dir(p, 9)])[0].endswith("9")


def test_parse_provenance() -> None:
    assert names.parse_provenance(b"orders:3 1:17 in:0:99") == (b"orders:3", b"1:17", b"in:0:99")
    assert names.parse_provenance(b"orders:3 1:17 -") == (b"orders:3", b"1:17", b"-")
    assert names.parse_provenance(b"not ours") is None
    assert names.parse_provenance(b"") is None
    assert names.parse_provenance(b"a b c d") is None


def test_compact_provenance_round_trip() -> None:
    """The compact form reads back as the text form's fields (a sink holds both forms)."""
    field = names.provenance_checkpoint_field("orders", 12, "0123456789abcdef").encode()
    value = names.compact_provenance(field, 3, 40, ("in", 2, 2**40 + 5))
    text = b"orders:12:01234567 3:40 in:2:1099511627781"
    assert value[0] == names.PROVENANCE_COMPACT
    assert names.parse_provenance(value) == (b"orders:12:01234567", b"3:40", b"in:2:%d" % (2**40 + 5))
    assert names.parse_provenance(value) == names.parse_provenance(text)
    dropped = names.compact_provenance(field, 0, 7, None)
    assert names.parse_provenance(dropped) == (b"orders:12:01234567", b"0:7", b"-")
    # a checkpoint field without the identity (written before identities)
    old = names.compact_provenance(b"orders:12", 1, 0, ("in", 0, 0))
    fields = names.parse_provenance(old)
    assert fields == (b"orders:12", b"1:0", b"in:0:0")
    assert names.parse_checkpoint_field(fields[0], "orders") == (12, None)
    assert names.parse_checkpoint_field(names.parse_provenance(value)[0], "orders") == (12, "01234567")  # type: ignore[index]
    # the compact form is the shorter
    assert len(value) < len(text)


def test_compact_provenance_malformed_is_refused() -> None:
    field = b"orders:12:01234567"
    value = names.compact_provenance(field, 3, 40, ("in", 2, 99))
    dropped = len(names.compact_provenance(field, 3, 40, None))  # ends there: a valid value
    for cut in range(1, len(value) - len(b"in")):  # cut inside a length, a number or a name
        if cut != dropped:
            assert names.parse_provenance(value[:cut]) is None, value[:cut]
    assert names.parse_provenance(b"\x01") is None
    assert names.parse_provenance(b"\x01\x7forders") is None  # a length past the end
    assert names.parse_provenance(b"\x01\x00\x00\x01\x00\x00") is None  # no pipeline
    assert names.parse_provenance(b"\x01\x02a:\x00\x01\x00\x00") is None  # ':' in the pipeline
    assert names.parse_provenance(b"\x01\x02a:\x00\x01\x00\x00") is None  # again (its head is known)
    assert names.parse_provenance(value) is not None  # a known head, a good value
    assert names.parse_provenance(b"\x01\x01a\x00" + b"\xff" * 11) is None  # a number past 64 bits
    assert names.parse_provenance(b"\x01\x01a\x00\x01\x00\x00\x00\x00in put") is None  # space in topic
    with pytest.raises(ValueError, match="checkpoint field"):
        names.compact_provenance_prefix(b"orders", 0)
    with pytest.raises(ValueError, match="negative"):
        names.varint(-1)


def test_varint() -> None:
    assert names.varint(0) == b"\x00"
    assert names.varint(127) == b"\x7f"
    assert names.varint(128) == b"\x80\x01"
    assert names.varint(300) == b"\xac\x02"


def test_marker_metadata_round_trip() -> None:
    assert names.marker_metadata("abc123") == "eo1:abc123"
    assert names.marker_identity("eo1:abc123") == "abc123"
    assert names.marker_identity("") is None  # a marker written before identities
    assert names.marker_identity(None) is None
    assert names.marker_identity("something else") is None


def test_provenance_checkpoint_field_old_and_new() -> None:
    field = names.provenance_checkpoint_field("orders", 12, "0123456789abcdef")
    assert field == "orders:12:01234567"
    assert names.parse_checkpoint_field(field.encode(), "orders") == (12, "01234567")
    assert names.parse_checkpoint_field(b"orders:12", "orders") == (12, None)  # old headers
    assert names.parse_checkpoint_field(b"orders-2:12:01234567", "orders") is None
    assert names.parse_checkpoint_field(b"orders:x", "orders") is None
    assert names.parse_checkpoint_field(b"orders:1:2:3", "orders") is None
