"""Open transactions: on the sink partitions and as Kafka's transaction admin lists them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

from airflow_provider_eo.core.doctor.report import Finding
from airflow_provider_eo.core.hanging import PipelineTransactions
from airflow_provider_eo.ledger import CheckpointRecord


def judge_open_transactions(
    sink_topic: str,
    stable: Mapping[int, int],
    high: Mapping[int, int],
    *,
    unfinished: CheckpointRecord | None,
    transaction_timeout_ms: int,
    now: dt.datetime,
    client_version: str,
) -> Finding:
    """Open transactions on the sink partitions, and commits of ours in flight too long.

    ``stable`` (last stable offset) below ``high`` (high watermark) means a transaction is
    open on that partition: read_committed consumers wait until it ends. confluent-kafka has
    no ListTransactions/DescribeTransactions (:func:`judge_transactions` has their owner and
    age from Kafka's Java admin client); the ledger says whether a commit of ours started and when. A shard of
    the unfinished checkpoint PENDING for longer than the transaction timeout is a commit
    that died (warn: ``eo commit`` fences it and finishes by the marker).
    """
    check = "open-transactions"
    open_parts = sorted(p for p in high if stable.get(p, high[p]) < high[p])
    limit = dt.timedelta(milliseconds=transaction_timeout_ms)
    stale = []
    if unfinished is not None:
        for sh in unfinished.shards:
            updated = sh.updated_at if sh.updated_at.tzinfo else sh.updated_at.replace(tzinfo=dt.UTC)
            if sh.state.value == "PENDING" and now - updated > limit:
                stale.append(
                    f"shard {sh.shard} ({sh.transactional_id}) since {updated.isoformat(timespec='seconds')}"
                )
    unlisted = (
        f"confluent-kafka {client_version} cannot describe broker transactions: the "
        "'transactions' check lists them with Kafka's Java admin client"
    )
    if stale:
        cid = unfinished.checkpoint_id if unfinished is not None else "?"
        return Finding(
            check,
            "warn",
            f"checkpoint {cid}: commit started and unfinished for longer than transaction_timeout_ms="
            f"{transaction_timeout_ms}: {'; '.join(stale)}"
            + (f"; open transaction(s) on {sink_topic}{open_parts}" if open_parts else ""),
            "run `eo recover MODULE:ATTR` (or `eo commit MODULE:ATTR --checkpoint "
            f"{cid}`): it fences those transactional ids (init_transactions aborts what is open) "
            "and publishes only what the markers lack",
        )
    if open_parts:
        lag = ", ".join(f"[{p}] {stable.get(p)} < {high[p]}" for p in open_parts)
        return Finding(
            check,
            "warn",
            f"open transaction(s) on {sink_topic} (last stable offset < high watermark: {lag}); "
            f"no commit of ours is pending in the ledger; {unlisted}",
            "run `eo recover MODULE:ATTR`: it fences every transactional id of this pipeline, "
            "which aborts an open transaction of ours; if one stays open it is not ours: find its "
            f"owner with `kafka-transactions.sh --bootstrap-server ... find-hanging --topic {sink_topic}` "
            "and abort it there",
        )
    return Finding(
        check, "ok", f"no open transaction on {sink_topic} (last stable offset = high watermark); {unlisted}"
    )


def judge_transactions(
    listed: PipelineTransactions | None,
    error: str | None,
    *,
    pipeline: str,
    unfinished: CheckpointRecord | None,
    now: dt.datetime,
) -> list[Finding]:
    """The open transactions Kafka's Java admin client listed on the sink and the marker
    group's ``__consumer_offsets`` partition (``listed``), one finding each: ours (a commit
    shard's transactional id of this pipeline, or a hanging one whose producer id the ledger
    recorded) with their age and the ledger's shard, foreign ones named as foreign.

    Ours is ``ok`` while a committer holds the unfinished checkpoint's lease and the
    transaction is younger than its timeout (a commit in progress), else ``warn``
    (``eo recover --abort-hanging`` ends it). Foreign: ``warn``, never touched by eo.
    ``error``: the listing could not run (``warn``, naming what is missing).
    """
    check = "transactions"
    if listed is None:
        return [
            Finding(
                check,
                "warn",
                f"open transactions were not listed: {error}",
                "install a Java 17+ runtime and run `eo setup jars` where the doctor runs (Kafka's "
                "Java admin client lists transactions; librdkafka cannot)",
            )
        ]
    where = ", ".join(sorted({t for t, _p in listed.partitions}))
    out: list[Finding] = []
    lease = unfinished.commit_lease_until if unfinished is not None else None
    if lease is not None and lease.tzinfo is None:
        lease = lease.replace(tzinfo=dt.UTC)
    live = unfinished is not None and lease is not None and lease > now
    for a in listed.transactions:
        line = a.describe(listed.now_ms)
        if not a.ours:
            out.append(
                Finding(
                    check,
                    "warn",
                    f"{line}: not pipeline {pipeline!r}'s; read_committed consumers of its partitions "
                    "wait until it ends",
                    "eo never ends it: ask its owner, or, if it is known to be abandoned, abort it with "
                    "`kafka-transactions.sh --bootstrap-server ... abort`",
                )
            )
        elif live and not a.txn.hanging(listed.now_ms) and unfinished is not None:
            out.append(
                Finding(
                    check,
                    "ok",
                    f"{line}; checkpoint {unfinished.checkpoint_id} is being committed by "
                    f"{unfinished.commit_owner!r} (lease until {lease.isoformat() if lease else '?'})",
                )
            )
        else:
            out.append(
                Finding(
                    check,
                    "warn",
                    f"{line}; no committer holds a live commit lease"
                    if not live
                    else f"{line}; open longer than its transaction timeout or unknown to its coordinator",
                    "run `eo recover MODULE:ATTR --abort-hanging` (once no committer of this pipeline is "
                    "running): it ends our open transactions and commits a PREPARED checkpoint by its "
                    "markers",
                )
            )
    if listed.errors:
        out.append(
            Finding(
                check,
                "warn",
                f"some partitions could not be described: {'; '.join(listed.errors)}",
                "grant Read on those topics (DescribeProducers) to see hanging transactions there",
            )
        )
    if not listed.transactions:
        out.append(
            Finding(check, "ok", f"no open transaction on {where} (listed with Kafka's Java admin client)")
        )
    return out
