"""The decisions of ``eo doctor`` (pure: facts in, findings out)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

import pytest

from airflow_provider_eo.core.doctor import (
    DoctorReport,
    Finding,
    judge_connector,
    judge_ledger,
    judge_marker_group,
    judge_open_transactions,
    judge_prefix,
    judge_query,
    judge_same_name,
    judge_sink_topic,
    judge_source_topics,
    judge_staging,
    judge_transaction_timeout,
)
from airflow_provider_eo.ledger import CheckpointRecord, CheckpointState, CommitPlan
from airflow_provider_eo.ledger.records import ShardRecord
from airflow_provider_eo.ledger.states import ShardState

NOW = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)


def _cp(
    cid: int, state: CheckpointState, sink_partitions: int | None, shards: tuple[ShardRecord, ...] = ()
) -> CheckpointRecord:
    plan = (
        CommitPlan(
            sink_topic="out",
            sink_partitions=sink_partitions,
            transactional_id_prefix="eo",
            marker_group="eo-marker.p",
            shard_of_partition=tuple(0 for _ in range(sink_partitions)),
        )
        if sink_partitions is not None
        else None
    )
    return CheckpointRecord(
        pipeline="p",
        checkpoint_id=cid,
        state=state,
        lineage=1,
        ranges=(),
        planned_at=NOW,
        commit_plan=plan,
        shards=shards,
    )


def test_report_is_safe_with_warnings_and_not_with_a_fail() -> None:
    ok = Finding("a", "ok", "fine")
    warn = Finding("b", "warn", "hm", "look")
    fail = Finding("c", "fail", "broken", "fix")
    assert DoctorReport("p", (ok, warn)).exit_code == 0
    report = DoctorReport("p", (ok, warn, fail))
    assert report.exit_code == 1 and not report.safe
    assert report.as_dict()["counts"] == {"ok": 1, "warn": 1, "fail": 1}
    assert report.as_dict()["findings"][2] == {
        "check": "c",
        "severity": "fail",
        "found": "broken",
        "change": "fix",
    }
    with pytest.raises(ValueError):
        Finding("x", "error", "no such severity")  # type: ignore[arg-type]


def test_transaction_timeout_above_any_broker_max_fails_naming_both_values() -> None:
    f = judge_transaction_timeout(60_000, {1: 900_000, 2: 30_000}, pipeline="p")
    assert f.severity == "fail"
    assert "broker 2: 30000" in f.found and "60000" in f.found
    assert "at most 30000" in f.change
    assert judge_transaction_timeout(60_000, {1: 60_000}, pipeline="p").severity == "ok"
    assert judge_transaction_timeout(60_000, {1: None}, pipeline="p").severity == "warn"
    assert judge_transaction_timeout(60_000, {}, pipeline="p").severity == "warn"


def test_source_topics_missing_or_shrunk_fail_new_partitions_are_ok() -> None:
    expected = {("in", 0): 5, ("in", 1): 7}
    missing = judge_source_topics(["in"], {"in": None}, {}, pipeline="p")
    assert [f.severity for f in missing] == ["fail"] and "'in' does not exist" in missing[0].found
    shrunk = judge_source_topics(["in"], {"in": [0]}, expected, pipeline="p")
    assert shrunk[0].severity == "fail" and "in[1]" in shrunk[0].found and "2 partitions" in shrunk[0].change
    grown = judge_source_topics(["in"], {"in": [0, 1, 2]}, expected, pipeline="p")
    assert grown[0].severity == "ok" and "[2] will start from earliest" in grown[0].found
    fresh = judge_source_topics(["in"], {"in": [0, 1]}, {}, pipeline="p")
    assert fresh[0].severity == "ok" and "no checkpoint yet" in fresh[0].found


def test_sink_topic_against_the_frozen_plan_and_the_last_commit() -> None:
    assert (
        judge_sink_topic("out", None, pipeline="p", unfinished=None, last_committed=None)[0].severity
        == "fail"
    )
    planned = _cp(4, CheckpointState.PREPARED, 3)
    below = judge_sink_topic("out", 2, pipeline="p", unfinished=planned, last_committed=None)[0]
    assert below.severity == "fail" and "checkpoint 4" in below.found and "eo abort" in below.change
    assert (
        judge_sink_topic("out", 4, pipeline="p", unfinished=planned, last_committed=None)[0].severity == "ok"
    )
    committed = _cp(3, CheckpointState.COMMITTED, 3)
    recreated = judge_sink_topic("out", 1, pipeline="p", unfinished=None, last_committed=committed)[0]
    assert recreated.severity == "warn" and "re-created" in recreated.found
    assert (
        judge_sink_topic("out", 3, pipeline="p", unfinished=None, last_committed=committed)[0].severity
        == "ok"
    )


def test_prefix_pinned_differently_or_namespace_shared_fails() -> None:
    assert judge_prefix("p", "eo", None, []).severity == "ok"
    assert (
        judge_prefix("p", "eo", "eo", [("p", "eo"), ("q", "eo")]).severity == "ok"
    )  # same prefix, other name
    pinned = judge_prefix("p", "new", "eo", [("p", "eo")])
    assert pinned.severity == "fail" and "transactional_id_prefix='eo'" in pinned.change
    # eo + a.b and eo.a + b both give eo.a.b.<shard>
    clash = judge_prefix("a.b", "eo", None, [("b", "eo.a")])
    assert clash.severity == "fail" and "['b']" in clash.found
    assert judge_prefix("a.b", "eo", None, [("b", None)]).severity == "ok"  # nothing pinned there yet


def test_marker_group_members_and_foreign_identity_fail() -> None:
    assert [f.severity for f in judge_marker_group("g", [], None)] == ["ok", "ok"]
    members, identity = judge_marker_group("g", ["rdkafka@/127.0.0.1"], "markers of identity X")
    assert members.severity == "fail" and "rdkafka@/127.0.0.1" in members.found
    assert identity.severity == "fail" and identity.found == "markers of identity X"


def test_another_deployment_of_the_name_fails_with_the_plans_refusal() -> None:
    assert judge_same_name("p", None).severity == "ok"
    refused = judge_same_name("p", "pipeline 'p' ... is also run by another deployment")
    assert refused.severity == "fail" and refused.found.endswith("another deployment")
    assert "another pipeline name" in refused.change


def _shard(state: ShardState, age_s: float) -> ShardRecord:
    return ShardRecord(
        shard=0,
        transactional_id="eo.p.0",
        producer_id=None,
        producer_epoch=None,
        state=state,
        records=0,
        updated_at=NOW - dt.timedelta(seconds=age_s),
    )


def test_open_transactions() -> None:
    kw = {"transaction_timeout_ms": 60_000, "now": NOW, "client_version": "2.16.1"}
    clean = judge_open_transactions("out", {0: 5, 1: 3}, {0: 5, 1: 3}, unfinished=None, **kw)  # type: ignore[arg-type]
    assert clean.severity == "ok" and "'transactions' check lists them" in clean.found
    held = judge_open_transactions("out", {0: 5, 1: 2}, {0: 5, 1: 3}, unfinished=None, **kw)  # type: ignore[arg-type]
    assert held.severity == "warn" and "[1] 2 < 3" in held.found
    recent = _cp(7, CheckpointState.PREPARED, 1, (_shard(ShardState.PENDING, 10),))
    assert judge_open_transactions("out", {0: 5}, {0: 5}, unfinished=recent, **kw).severity == "ok"  # type: ignore[arg-type]
    stale = _cp(7, CheckpointState.PREPARED, 1, (_shard(ShardState.PENDING, 120),))
    old = judge_open_transactions("out", {0: 4}, {0: 5}, unfinished=stale, **kw)  # type: ignore[arg-type]
    assert old.severity == "warn" and "checkpoint 7" in old.found and "--checkpoint 7" in old.change
    done = _cp(7, CheckpointState.PREPARED, 1, (_shard(ShardState.COMMITTED, 120),))
    assert judge_open_transactions("out", {0: 5}, {0: 5}, unfinished=done, **kw).severity == "ok"  # type: ignore[arg-type]


def test_connector_from_settings_or_cache() -> None:
    pkg = {"spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"}
    assert judge_connector(pkg, "4.2.0", cached_jars=[]).severity == "ok"
    wrong = judge_connector(
        {"spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:3.5.1"}, "4.2.0", cached_jars=[]
    )
    assert wrong.severity == "fail" and "spark-sql-kafka-0-10_2.13:4.2.0" in wrong.change
    jar = {"spark.jars": "/x/spark-sql-kafka-0-10_2.13-4.2.0.jar"}
    assert judge_connector(jar, "4.2.0", cached_jars=[], exists=lambda _p: True).severity == "ok"
    assert judge_connector(jar, "4.2.0", cached_jars=[], exists=lambda _p: False).severity == "fail"
    other_jars = judge_connector({"spark.jars": "/x/mine.jar"}, "4.2.0", cached_jars=["/c/a.jar"])
    assert other_jars.severity == "fail"  # spark.jars set: eo's cache is not added
    assert judge_connector({}, "4.2.0", cached_jars=["/c/a.jar"]).severity == "ok"
    assert judge_connector({}, "4.2.0", cached_jars=[]).severity == "warn"


def test_ledger_revision() -> None:
    assert judge_ledger("0004", "0004", dialect="postgresql", url="u").severity == "ok"
    assert judge_ledger(None, "0004", dialect="postgresql", url="u").severity == "warn"
    assert judge_ledger("0003", "0004", dialect="sqlite", url="u").severity == "warn"
    old = judge_ledger("0003", "0004", dialect="postgresql", url="u")
    assert old.severity == "fail" and "eo ledger upgrade" in old.change


def test_staging() -> None:
    assert judge_staging("/s", None).severity == "ok"
    bad = judge_staging("/s", "PermissionError: denied")
    assert bad.severity == "fail" and "denied" in bad.found


def test_render_prints_each_finding_its_change_and_the_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    from airflow_provider_eo.render import print_doctor

    report = DoctorReport(
        "p",
        (
            Finding("staging", "ok", "writable", "unused"),
            Finding("sink-topic out", "fail", "missing", "create it"),
        ),
    )
    print_doctor(report)
    out = capsys.readouterr().out
    assert "FAIL sink-topic out: missing" in out and "-> create it" in out
    assert "unused" not in out  # an ok finding's change is not printed
    assert "not safe to run (1 ok, 0 warn, 1 fail)" in out


def test_staging_shared_fails_when_the_executors_rows_are_not_all_visible() -> None:
    from airflow_provider_eo.core.doctor import judge_staging_shared

    ok = judge_staging_shared("/data/staging", 1000, 1000, "worker-1", None)
    assert ok.severity == "ok" and "the 1000 rows" in ok.found
    unseen = judge_staging_shared("/data/staging", 1000, 0, "airflow-worker", None)
    assert unseen.severity == "fail"
    assert "wrote 1000 rows under /data/staging but this process (airflow-worker) sees 0" in unseen.found
    assert "a local folder works only with a local master" in unseen.change
    broken = judge_staging_shared("/data/staging", None, 0, "h", "Py4JError: no master")
    assert broken.severity == "fail" and "Py4JError: no master" in broken.found


# -- a Structured Streaming query's batches ---------------------------------------------------


@dataclass(frozen=True)
class _Location:
    location: str
    query_id: str | None
    latest_offsets: int | None
    latest_commit: int | None


def _batch(batch: int, state: CheckpointState, query: str = "q1") -> CheckpointRecord:
    return CheckpointRecord(
        pipeline="agg",
        checkpoint_id=batch + 1,
        state=state,
        lineage=1,
        ranges=(),
        planned_at=NOW,
        query_id=query,
        batch_id=batch,
    )


RUNNING = {"run_id": "r1", "state": "RUNNING", "host": "h", "pid": 7, "heartbeat_age_s": 1.0}


def _by_check(findings: list[Finding]) -> dict[str, Finding]:
    return {f.check: f for f in findings}


def test_query_at_the_ledgers_batch_running_is_ok() -> None:
    got = _by_check(
        judge_query("agg", _batch(4, CheckpointState.COMMITTED), RUNNING, _Location("/ck", "q1", 5, 4))
    )
    assert {c: f.severity for c, f in got.items()} == {
        "query-run": "ok",
        "query-batch": "ok",
        "query-identity": "ok",
        "query-position": "ok",
    }


def test_query_location_of_another_query_or_none_fails() -> None:
    other = _by_check(
        judge_query("agg", _batch(4, CheckpointState.COMMITTED), RUNNING, _Location("/ck", "q2", 0, 0))
    )
    assert other["query-identity"].severity == "fail" and "q2" in other["query-identity"].found
    empty = _by_check(
        judge_query("agg", _batch(4, CheckpointState.COMMITTED), None, _Location("/ck", None, None, None))
    )
    assert empty["query-identity"].severity == "fail"
    assert empty["query-run"].severity == "warn"
    unknown = _by_check(judge_query("agg", _batch(4, CheckpointState.COMMITTED), RUNNING, None))
    assert (
        unknown["query-identity"].severity == "warn"
        and "checkpoint_location" in unknown["query-identity"].change
    )


def test_query_location_behind_or_ahead_of_the_ledger() -> None:
    ended = {**RUNNING, "state": "ENDED", "reason": "the query ended"}
    behind = _by_check(
        judge_query("agg", _batch(6, CheckpointState.COMMITTED), ended, _Location("/ck", "q1", 3, 3))
    )
    assert (
        behind["query-position"].severity == "warn"
        and "re-runs batches 4..6" in behind["query-position"].found
    )
    one_behind = _by_check(
        judge_query("agg", _batch(6, CheckpointState.COMMITTED), ended, _Location("/ck", "q1", 6, 5))
    )
    assert one_behind["query-position"].severity == "ok"
    ahead = _by_check(
        judge_query("agg", _batch(6, CheckpointState.COMMITTED), ended, _Location("/ck", "q1", 8, 8))
    )
    assert ahead["query-position"].severity == "fail"


def test_a_prepared_batch_without_a_running_query_is_flagged() -> None:
    stale = {**RUNNING, "state": "STALE", "heartbeat_age_s": 60.0}
    got = _by_check(
        judge_query("agg", _batch(2, CheckpointState.PREPARED), stale, _Location("/ck", "q1", 2, 1))
    )
    assert got["query-run"].severity == "warn" and "silent for 60.0s" in got["query-run"].found
    assert got["query-batch"].severity == "warn" and "PREPARED" in got["query-batch"].found
    live = _by_check(
        judge_query("agg", _batch(2, CheckpointState.PREPARED), RUNNING, _Location("/ck", "q1", 2, 1))
    )
    assert live["query-batch"].severity == "ok"


def test_transactions_ours_foreign_and_not_listed() -> None:
    from airflow_provider_eo.core.doctor import judge_transactions
    from airflow_provider_eo.core.hanging import PipelineTransactions, attribute
    from airflow_provider_eo.kafka.transactions import OpenTransaction

    now_ms = int(NOW.timestamp() * 1000)

    def txn(tid: str, start_ago_s: int = 30) -> OpenTransaction:
        return OpenTransaction(7, 2, tid, "ONGOING", now_ms - start_ago_s * 1000, 60_000, (("out", 0),))

    def listed(*txns: OpenTransaction) -> PipelineTransactions:
        got = attribute(txns, pipeline="p", namespaces=["eo.p."], known_ids=[], checkpoints=[])
        return PipelineTransactions((("out", 0), ("__consumer_offsets", 3)), got, (), now_ms)

    kw = {"pipeline": "p", "now": NOW}
    (clean,) = judge_transactions(listed(), None, unfinished=None, **kw)  # type: ignore[arg-type]
    assert clean.severity == "ok" and "no open transaction on __consumer_offsets, out" in clean.found
    ours, foreign = judge_transactions(listed(txn("eo.p.0"), txn("other.0")), None, unfinished=None, **kw)  # type: ignore[arg-type]
    assert (
        ours.severity == "warn" and ours.found.startswith("ours: 'eo.p.0'") and "open for 30s" in ours.found
    )
    assert "--abort-hanging" in ours.change and "no committer holds a live commit lease" in ours.found
    assert foreign.severity == "warn" and foreign.found.startswith("foreign: 'other.0'")
    assert "eo never ends it" in foreign.change
    # A committer holds the lease and the transaction is younger than its timeout: a commit
    # in progress; older than its timeout: warned although the lease runs.
    live = replace(
        _cp(7, CheckpointState.PREPARED, 1),
        commit_owner="eo.p@h:1",
        commit_lease_until=NOW + dt.timedelta(seconds=60),
    )
    (busy,) = judge_transactions(listed(txn("eo.p.0")), None, unfinished=live, **kw)  # type: ignore[arg-type]
    assert busy.severity == "ok" and "checkpoint 7 is being committed by 'eo.p@h:1'" in busy.found
    (stuck,) = judge_transactions(listed(txn("eo.p.0", 90)), None, unfinished=live, **kw)  # type: ignore[arg-type]
    assert stuck.severity == "warn" and "open longer than its transaction timeout" in stuck.found
    (missing,) = judge_transactions(
        None, "TransactionAdminUnavailable: no Java runtime", unfinished=None, **kw
    )  # type: ignore[arg-type]
    assert (
        missing.severity == "warn"
        and "no Java runtime" in missing.found
        and "eo setup jars" in missing.change
    )
