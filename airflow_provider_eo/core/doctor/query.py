"""The Structured Streaming query whose batches the checkpoints are: its checkpoint
location against the ledger."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from airflow_provider_eo.core.doctor.report import Finding, Severity
from airflow_provider_eo.ledger import CheckpointRecord


class QueryLocationFacts(Protocol):
    """What a Structured Streaming query's checkpoint location says (read by the caller:
    the doctor does not read Spark's files itself)."""

    @property
    def location(self) -> str:
        """The location as given."""

    @property
    def query_id(self) -> str | None:
        """The query's id in its ``metadata`` (None: no query there)."""

    @property
    def latest_offsets(self) -> int | None:
        """The newest batch of its offset log."""

    @property
    def latest_commit(self) -> int | None:
        """The newest batch of its commit log."""


def judge_query(
    pipeline: str,
    newest: CheckpointRecord,
    run: Mapping[str, Any] | None,
    location: QueryLocationFacts | None,
    location_error: str | None = None,
) -> list[Finding]:
    """The checks of a pipeline whose checkpoints are a Structured Streaming query's batches
    (``newest``: the ledger's newest live one, with ``query_id`` and ``batch_id``):

    - ``query-run``: the query's newest run in the ledger (``run``: the dashboard's stream
      row, ``state`` ``RUNNING``/``STALE``/``ENDED``/``FAILED``/``LOST``);
    - ``query-batch``: a batch PLANNED or PREPARED waits for the query to run again;
    - ``query-identity`` and ``query-position``: the checkpoint location's query id and
      commit log against the ledger (``location``: None when not known here).
    """
    query, batch = newest.query_id, newest.batch_id
    out: list[Finding] = []
    live = run is not None and run.get("state") == "RUNNING"
    if run is None:
        out.append(
            Finding("query-run", "warn", f"pipeline {pipeline!r}: no run of query {query} is recorded")
        )
    elif live:
        out.append(
            Finding(
                "query-run",
                "ok",
                f"query {query} runs (run {run.get('run_id')} on {run.get('host')} pid {run.get('pid')}, "
                f"heartbeat {run.get('heartbeat_age_s')}s ago)",
            )
        )
    elif run.get("state") == "STALE":
        out.append(
            Finding(
                "query-run",
                "warn",
                f"run {run.get('run_id')} of query {query} on {run.get('host')} pid {run.get('pid')} is "
                f"RUNNING in the ledger but silent for {run.get('heartbeat_age_s')}s (killed, or its "
                "host is gone)",
                "restart the query from its checkpoint location; its start declares the silent run LOST",
            )
        )
    else:
        severity: Severity = "warn" if run.get("state") in ("FAILED", "LOST") else "ok"
        out.append(
            Finding(
                "query-run",
                severity,
                f"query {query} is not running: run {run.get('run_id')} {run.get('state')}"
                + (f" ({run.get('reason')})" if run.get("reason") else ""),
                "" if severity == "ok" else "fix what the reason says, then start the query again",
            )
        )
    waiting = newest.state.value in ("PLANNED", "PREPARED")
    if waiting:
        does = "commits its staged output" if newest.state.value == "PREPARED" else "stages and commits it"
        out.append(
            Finding(
                "query-batch",
                "ok" if live else "warn",
                f"batch {batch} (checkpoint {newest.checkpoint_id}) is {newest.state.value}"
                + ("; the running query finishes it" if live else "; no query runs to finish it"),
                "" if live else f"start the query from its checkpoint location: its next batch {does}",
            )
        )
    else:
        out.append(
            Finding(
                "query-batch",
                "ok",
                f"batch {batch} (checkpoint {newest.checkpoint_id}) is {newest.state.value}; none waits",
            )
        )
    if location is None:
        out.append(
            Finding(
                "query-identity",
                "fail" if location_error else "warn",
                location_error or "the query's checkpoint location is not known here: not checked",
                "check the location is readable from here"
                if location_error
                else "give KafkaExactlyOnceSink(checkpoint_location=...)",
            )
        )
        return out
    where = f"checkpoint location {location.location!r}"
    if location.query_id is None:
        out.append(
            Finding(
                "query-identity",
                "fail",
                f"{where} holds no query (no 'metadata'): a query started there gets a new id, which "
                f"the sink refuses (its batches are query {query}'s)",
                "start the query from the location it ran from, or from a copy of it",
            )
        )
        return out
    if location.query_id != query:
        out.append(
            Finding(
                "query-identity",
                "fail",
                f"{where} is query {location.query_id}'s, the ledger's batches are query {query}'s: the "
                "sink refuses its batches (QueryIdentityMismatch)",
                "start the query from its own location, or give KafkaExactlyOnceSink(allow_new_query=True) "
                "to let the new query continue where the old one ended",
            )
        )
        return out
    out.append(Finding("query-identity", "ok", f"{where} is query {query}'s, as the ledger's batches"))
    assert batch is not None
    done = -1 if location.latest_commit is None else location.latest_commit
    if done > batch:
        out.append(
            Finding(
                "query-position",
                "fail",
                f"{where} committed batch {done}, the ledger knows batches up to {batch}: its next batch's "
                "ranges do not continue the ledger's, the sink refuses it",
                "use the ledger this query wrote to (ledger_url), or start the query from a copy at "
                f"batch {batch} or below",
            )
        )
    elif done < batch - 1:
        out.append(
            Finding(
                "query-position",
                "warn",
                f"{where} is at batch {done}, behind the ledger's batch {batch} (a restored copy): the "
                f"query re-runs batches {done + 1}..{batch} without publishing them (already published); "
                f"the batch after {batch} is published only when its ranges start where batch {batch} "
                "ended, else the sink refuses it",
                "start from a copy at the ledger's newest batch to continue exactly",
            )
        )
    else:
        out.append(
            Finding(
                "query-position",
                "ok",
                f"{where} committed batch {done}; the ledger's newest is batch {batch} "
                f"({newest.state.value})"
                + (
                    f": the query's next start re-runs batch {batch} without publishing it again"
                    if done < batch and newest.state.value == "COMMITTED"
                    else ""
                ),
            )
        )
    return out
