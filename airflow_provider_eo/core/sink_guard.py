"""What the sink says about the ledger, checked before anything is planned or published.

The ledger is the record of what was published, but it can be replaced under a running
deployment: restored from an older backup or VM snapshot, re-created empty, or a second
deployment can run the same pipeline name with a ledger of its own. Kafka keeps two
independent proofs of what was published: the commit markers (group offsets: cheap to
read, but they expire after ``offsets.retention.minutes``) and the output itself (every
record's ``eo.prov`` header names the pipeline, the checkpoint and the ledger identity).

- :func:`check_sink` (every plan): a marker above the ledger's highest checkpoint id
  means the ledger is older than the sink (:class:`LedgerBehindSink`). When no shard has a
  marker (never committed, or expired), the newest records of every sink partition are
  read instead: output of this identity with a higher checkpoint id is the same refusal,
  and a first plan that finds this pipeline name's output from another ledger is refused
  (:class:`ForeignOutputInSink`) unless an explicit restore/reset chose where to start.
- :func:`check_other_deployments` (every plan, and ``eo doctor``): the marker group is named
  from the pipeline name only, so a second deployment of the same name (another ledger,
  another sink topic) commits its markers into it too. A marker on a topic other than this
  pipeline's sink naming another identity is refused (:class:`PipelineNameInUse`): the two
  would share transactional ids and the default consumer group.
- :func:`check_commit_markers` (every commit): a shard whose marker is already past the
  checkpoint being committed (possible only with an older ledger: checkpoints commit in
  order) is refused instead of being skipped as published.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from airflow_provider_eo import names
from airflow_provider_eo.core.kafka_clients import KafkaClients, kafka_clients
from airflow_provider_eo.core.markers import NO_MARKER, read_markers
from airflow_provider_eo.errors import ForeignOutputInSink, LedgerBehindSink, PipelineNameInUse
from airflow_provider_eo.ledger import PipelineRecord
from airflow_provider_eo.pipeline import Pipeline

__all__ = [
    "SINK_SCAN_RECORDS",
    "SinkOutput",
    "check_commit_markers",
    "check_other_deployments",
    "check_sink",
    "mark_clear",
    "other_deployments",
    "other_deployments_error",
    "recently_clear",
    "scan_sink",
]

#: How many of the newest offsets of each sink partition the scan reads.
SINK_SCAN_RECORDS = 1000


@dataclass
class SinkOutput:
    """What the newest sink records show of one ledger's output of a pipeline name.

    :param identity: the first characters of the ledger identity the records name; ``None``
        for records written before output named its ledger.
    :param checkpoint: the highest checkpoint id seen.
    :param records: how many records of it the scan saw.
    :param next_offsets: per source topic and partition, one past the highest source offset
        seen: where that output ends (the ``eo reset --to offsets=...`` to continue after it).
    """

    identity: str | None
    checkpoint: int = -1
    records: int = 0
    next_offsets: dict[str, dict[int, int]] = field(default_factory=dict)

    def offsets_literal(self) -> str:
        """:attr:`next_offsets` as ``{"topic": {"partition": offset}}`` JSON."""
        offsets = {
            t: {str(p): o for p, o in sorted(ps.items())} for t, ps in sorted(self.next_offsets.items())
        }
        return json.dumps(offsets, separators=(",", ":"))

    def reset_command(self, pipeline: str) -> str:
        """The ``eo reset`` that continues after this output."""
        return f"eo reset {pipeline} --to 'offsets={self.offsets_literal()}'"

    def describe(self) -> str:
        """One line: whose output, how much of it, up to which checkpoint."""
        who = f"ledger identity {self.identity}" if self.identity else "a ledger that predates identities"
        return f"{self.records} records of checkpoints up to {self.checkpoint} written by {who}"


def scan_sink(
    pipeline: Pipeline, per_partition: int = SINK_SCAN_RECORDS, *, clients: KafkaClients | None = None
) -> dict[str | None, SinkOutput]:
    """This pipeline name's output among the newest ``per_partition`` records of every sink
    partition, per ledger identity (read_committed)."""
    clients = kafka_clients(pipeline.kafka, clients)
    found: dict[str | None, SinkOutput] = {}
    for msg in clients.tail_records(pipeline.sink_topic, per_partition=per_partition):
        prov = dict(msg.headers() or []).get(names.HEADER_PROVENANCE)
        fields = names.parse_provenance(prov) if isinstance(prov, bytes) else None
        parsed = names.parse_checkpoint_field(fields[0], pipeline.name) if fields else None
        if fields is None or parsed is None:
            continue
        checkpoint, identity = parsed
        out = found.setdefault(identity, SinkOutput(identity))
        out.records += 1
        out.checkpoint = max(out.checkpoint, checkpoint)
        topic, _, rest = fields[2].decode(errors="replace").partition(":")
        partition, _, offset = rest.partition(":")
        if fields[2] != b"-" and partition.isdigit() and offset.isdigit():
            ends = out.next_offsets.setdefault(topic, {})
            ends[int(partition)] = max(ends.get(int(partition), 0), int(offset) + 1)
    return found


def _behind(
    pipeline: Pipeline, record: PipelineRecord, sink_shows: str, output: SinkOutput | None
) -> LedgerBehindSink:
    start = (
        " If this copy is all there is, run the pipeline under a new name starting where the "
        f"sink's output ends: startup=Startup(mode='offsets', offsets={output.offsets_literal()}) "
        "(source partitions it does not name had no output among the newest records)."
        if output is not None and output.next_offsets
        else ""
    )
    return LedgerBehindSink(
        f"pipeline {pipeline.name!r}: the ledger is older than the sink. {sink_shows}, but this "
        f"ledger's highest checkpoint is {record.last_checkpoint_id}: it was restored from an "
        "older copy (a backup or a VM snapshot). Nothing was planned or published: planning "
        "from it would re-issue checkpoint ids the sink already holds with other ranges. Point "
        f"ledger_url at the newest ledger of this pipeline.{start} `eo recover` does not repair "
        "this; `eo audit` against the newest ledger shows what the sink holds."
    )


def other_deployments(
    marks: Mapping[tuple[str, int], tuple[int, str]], *, sink_topic: str, identity: str | None
) -> dict[str, list[str]]:
    """The other deployments of a pipeline name that the marker group shows: ledger
    identity -> the topics its markers are on, from ``marks`` ((topic, partition) ->
    (checkpoint id, metadata): every committed offset of ``eo-marker.<name>``).

    Left out: markers on ``sink_topic`` (they are :func:`check_sink`'s: a re-created ledger or
    a second deployment on the same sink), markers of ``identity`` on any topic (this ledger
    changed its sink topic) and markers without an identity (written before markers carried
    one: nothing tells whose they are). ``identity=None`` (a pipeline this ledger has not
    registered yet) makes every identified marker another deployment's.
    """
    out: dict[str, set[str]] = {}
    for (topic, _partition), (_checkpoint, metadata) in marks.items():
        owner = names.marker_identity(metadata)
        if topic == sink_topic or owner is None or owner == identity:
            continue
        out.setdefault(owner, set()).add(topic)
    return {owner: sorted(topics) for owner, topics in sorted(out.items())}


def other_deployments_error(
    pipeline_name: str, group: str, sink_topic: str, identity: str | None, others: Mapping[str, list[str]]
) -> PipelineNameInUse:
    """The refusal naming every other deployment found (:func:`other_deployments`)."""
    found = "; ".join(
        f"ledger identity {owner} publishes to {', '.join(repr(t) for t in topics)}"
        for owner, topics in others.items()
    )
    topics = sorted({t for ts in others.values() for t in ts})
    delete = " and ".join(
        f"`kafka-consumer-groups.sh --bootstrap-server ... --delete-offsets --group {group} --topic {t}`"
        for t in topics
    )
    ours = f"identity {identity}" if identity else "no identity yet (its first plan)"
    return PipelineNameInUse(
        f"pipeline {pipeline_name!r} (this ledger: {ours}, sink {sink_topic!r}) is also run by "
        f"another deployment on this Kafka cluster: the commit markers in {group!r} show {found}. "
        "Two deployments of one pipeline name share their transactional ids (their committers "
        "fence each other) and the default consumer group (each moves the other's source "
        "offsets). Nothing was planned or published by this call; no data is at risk. "
        "Choose: give one of the two another pipeline name (staging and production, or two "
        "teams, need one each); or, if that deployment is retired for good, delete its "
        f"markers with {delete}. Markers stay until deleted or until the group's offsets "
        "expire (offsets.retention.minutes after its last commit)."
    )


#: How long this process trusts a clean same-name check (:func:`check_other_deployments`)
#: of one pipeline identity: the check reads the committed offsets of the marker group on
#: every partition of the cluster, too much for every checkpoint of a stream that
#: checkpoints every few seconds.
OTHER_DEPLOYMENTS_RECHECK_S = 60.0
_clear_at: dict[tuple[str, str, str, str | None], float] = {}


def recently_clear(step: str, bootstrap: str, group: str, identity: str | None) -> bool:
    """Whether this process's ``step`` (``plan`` or ``commit``: each trusts only its own
    answers, so a commit right after a clean plan still reads) found no other deployment
    for this group and identity within :data:`OTHER_DEPLOYMENTS_RECHECK_S`."""
    at = _clear_at.get((step, bootstrap, group, identity))
    return at is not None and time.monotonic() - at < OTHER_DEPLOYMENTS_RECHECK_S


def mark_clear(step: str, bootstrap: str, group: str, identity: str | None) -> None:
    """Remember a clean same-name check of ``step`` (see :func:`recently_clear`)."""
    _clear_at[(step, bootstrap, group, identity)] = time.monotonic()


def check_other_deployments(
    pipeline: Pipeline, identity: str | None, *, clients: KafkaClients | None = None
) -> None:
    """Refuse when another deployment of this pipeline name (another ledger identity) has
    committed markers on a topic other than this pipeline's sink (:func:`other_deployments`).

    One read of every committed offset of the marker group outside the sink (the topics'
    metadata, then one OffsetFetch; a clean answer is trusted for
    :data:`OTHER_DEPLOYMENTS_RECHECK_S`). Two deployments that both plan before either has
    committed are not seen here; the commit checks again before it publishes
    (``core/commit.py``), and after the first commit of either the other's next plan
    refuses.

    :raises PipelineNameInUse: naming the other identities, their topics and the choices.
    """
    clients = kafka_clients(pipeline.kafka, clients)
    group = names.marker_group(pipeline)
    bootstrap = str(pipeline.kafka.get("bootstrap.servers"))
    if recently_clear("plan", bootstrap, group, identity):
        return
    marks = clients.marks_elsewhere(group, pipeline.sink_topic)
    others = other_deployments(marks, sink_topic=pipeline.sink_topic, identity=identity)
    if others:
        raise other_deployments_error(pipeline.name, group, pipeline.sink_topic, identity, others)
    mark_clear("plan", bootstrap, group, identity)


def check_sink(pipeline: Pipeline, record: PipelineRecord, *, clients: KafkaClients | None = None) -> None:
    """Refuse to plan when the sink shows that this ledger is older than its output, or (on
    a pipeline's first plan) that another ledger published this pipeline name's output.

    :raises PipelineIdentityMismatch: a commit marker written by another ledger.
    :raises PipelineNameInUse: another deployment of this name publishes to another sink
        (:func:`check_other_deployments`).
    :raises LedgerBehindSink: a marker, or this identity's newest output, names a checkpoint
        above the ledger's highest id.
    :raises ForeignOutputInSink: the first plan of a new ledger finds this pipeline name's
        output written by another ledger (and no restore/reset chose a start since).
    """
    clients = kafka_clients(pipeline.kafka, clients)
    shards = range(clients.partition_count(pipeline.sink_topic))
    markers = read_markers(pipeline, shards, identity=record.identity, clients=clients)
    check_other_deployments(pipeline, record.identity, clients=clients)
    ahead = {s: m for s, m in markers.items() if m > record.last_checkpoint_id}
    if ahead:
        shows = ", ".join(f"shard {s} at checkpoint {m}" for s, m in sorted(ahead.items())[:5])
        output = scan_sink(pipeline, clients=clients).get(record.identity[: names.PROVENANCE_IDENTITY_CHARS])
        raise _behind(pipeline, record, f"Its commit markers show {shows}", output)
    if any(m != NO_MARKER for m in markers.values()):
        return  # the markers agree with the ledger: nothing to read
    # No marker at all (never committed, or they expired): the output is the proof left.
    found = scan_sink(pipeline, clients=clients)
    ours = found.pop(record.identity[: names.PROVENANCE_IDENTITY_CHARS], None)
    if ours is not None and ours.checkpoint > record.last_checkpoint_id:
        raise _behind(pipeline, record, f"Its newest output holds {ours.describe()}", ours)
    if found and record.last_checkpoint_id == 0 and record.current_lineage == 1:
        other = max(found.values(), key=lambda o: o.checkpoint)
        raise ForeignOutputInSink(
            f"pipeline {pipeline.name!r}: this ledger has never planned a checkpoint of it, but "
            f"the sink {pipeline.sink_topic!r} already holds its output: {other.describe()} "
            f"(this ledger's identity is {record.identity[: names.PROVENANCE_IDENTITY_CHARS]}). "
            "Starting here would publish that input again. Nothing was planned. Choose: point "
            "ledger_url at the ledger that wrote it; or continue after that output with "
            f"{other.reset_command(pipeline.name)}; or give this deployment another pipeline "
            "name (and its own sink)."
        )


def check_commit_markers(
    pipeline: Pipeline, record: PipelineRecord, checkpoint_id: int, markers: Mapping[int, int]
) -> None:
    """Refuse to commit ``checkpoint_id`` when a shard's marker (``markers``: shard ->
    checkpoint id) is already past it: checkpoints commit in order, so only a ledger older
    than the sink can be here (skipping the shard as published would lose its records)."""
    ahead = {s: m for s, m in markers.items() if m > checkpoint_id}
    if ahead:
        shows = ", ".join(f"shard {s} at checkpoint {m}" for s, m in sorted(ahead.items())[:5])
        raise _behind(
            pipeline,
            record,
            f"Committing checkpoint {checkpoint_id}, its commit markers already show {shows}",
            None,
        )
