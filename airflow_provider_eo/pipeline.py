"""The user's description of one exactly-once pipeline: ``Pipeline(...)``."""

from __future__ import annotations

import hashlib
import importlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_provider_eo.errors import PipelineConfigError as PipelineConfigError
from airflow_provider_eo.ledger.urls import DEFAULT_LEDGER_URL

StartupMode = Literal["earliest", "latest", "group", "timestamp", "offsets"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

#: Parts of a Kafka client setting's name that mark its value as a secret (librdkafka names,
#: and the ``java.`` ones for Spark's client): ``sasl.password``, ``ssl.key.password``,
#: ``sasl.oauthbearer.client.secret``, ``ssl.key.pem`` (an inline private key), JAAS configs.
SECRET_KAFKA_MARKERS = ("password", "secret", "sasl.jaas.config", "sasl.oauthbearer.config", "key.pem")


def is_secret_kafka_setting(key: str) -> bool:
    """Whether the Kafka client setting ``key`` holds a secret (:data:`SECRET_KAFKA_MARKERS`)."""
    lowered = str(key).lower()
    return any(marker in lowered for marker in SECRET_KAFKA_MARKERS)


# Client settings that would break the protocol if a user set them.
_FORBIDDEN_CLIENT_KEYS = {
    "transactional.id": "it is derived per commit shard as {prefix}.{pipeline}.{shard}",
    "enable.idempotence": "transactions require it and set it themselves",
    "isolation.level": "the pipeline always reads with read_committed",
    "enable.auto.commit": "offsets move only inside the commit transaction",
    "group.id": "use Pipeline(consumer_group=...)",
}
# The broker's default transaction.max.timeout.ms (15 minutes).
BROKER_MAX_TRANSACTION_TIMEOUT_MS = 900_000

#: Offsets a checkpoint plans at most unless the pipeline says otherwise. Each checkpoint pays a
#: fixed cost (the Spark job's planning and start, the staged write's commit, the ledger, the
#: commit's transaction) whatever its size, so a backlog caught up in small checkpoints goes at
#: a fraction of the rate of large ones: with bench/stream.py (5 s interval, local[2], one
#: broker), 125,000-offset checkpoints reached 0.56x Spark's own Kafka sink, 500,000-offset ones
#: 0.86x. Larger ones add little and hold the first output of a backlog back longer; the
#: transaction-timeout sizing (core/plan.py) still caps each checkpoint to what its commit
#: can publish in time.
DEFAULT_MAX_RECORDS_PER_CHECKPOINT = 500_000

#: Where a commit's shard transactions may run (``Pipeline.commit_mode``).
COMMIT_MODES = ("local", "spark", "auto")

#: The events a pipeline's ``notifiers`` may name (docs/observability.md, "Notifications").
NOTIFY_EVENTS = ("checkpoint_aborted", "data_loss", "dead_letters", "stream_stalled")


@dataclass(frozen=True)
class Startup:
    """Where a pipeline starts when the ledger has no checkpoint for a partition.

    :param mode: ``earliest`` | ``latest`` | ``group`` (the consumer group's committed
        offsets, falling back to ``fallback``) | ``timestamp`` | ``offsets``.
    :param timestamp_ms: for ``timestamp``: the first record at or after this time.
    :param offsets: for ``offsets``: ``{"topic": {partition: offset}}``.
    :param fallback: for ``group``: ``earliest`` or ``latest`` when the group has no offset.
    """

    mode: StartupMode = "earliest"
    timestamp_ms: int | None = None
    offsets: Mapping[str, Mapping[int, int]] | None = None
    fallback: Literal["earliest", "latest"] = "earliest"

    def __post_init__(self) -> None:
        if self.mode not in ("earliest", "latest", "group", "timestamp", "offsets"):
            raise PipelineConfigError(
                f"startup mode {self.mode!r} is unknown; use earliest, latest, group, timestamp or offsets"
            )
        if self.mode == "timestamp" and self.timestamp_ms is None:
            raise PipelineConfigError("startup mode 'timestamp' needs timestamp_ms=<epoch ms>")
        if self.mode == "offsets" and not self.offsets:
            raise PipelineConfigError("startup mode 'offsets' needs offsets={'topic': {partition: offset}}")


@dataclass(frozen=True)
class Pipeline:
    """One exactly-once Kafka -> PySpark -> Kafka pipeline.

    :param name: unique pipeline name (letters, digits, ``.``, ``_``, ``-``).
    :param kafka: librdkafka-style client config (``bootstrap.servers`` at least, unless
        ``kafka_conn_id`` names a connection that has it); used for
        the source, the sink and the admin calls. A ``java.<setting>`` key goes only to
        Spark's (Java) Kafka source as ``kafka.<setting>``: e.g. ``java.fetch.max.wait.ms``
        (eo's bounded reads use 20 ms unless it is set; the Java default, 500 ms, is waited
        once per task whose range ends at the log end).
    :param source_topics: topics to read.
    :param sink_topic: topic the output is published to, exactly once.
    :param transform: ``"module:function"`` taking and returning a Spark DataFrame. It gets
        the Kafka source columns (key, value, topic, partition, offset, timestamp, headers)
        and returns at least ``value``, optionally ``key``, ``headers``, ``partition``.
        ``None`` copies key and value unchanged.
    :param ledger_url: SQLAlchemy URL of the checkpoint ledger.
    :param kafka_conn_id: an Airflow ``kafka`` connection whose config is merged over
        ``kafka`` (its settings win): endpoints and credentials then live in Airflow's
        connections or secrets backend, not in code. Each process that needs it reads it
        (the Airflow task, the Spark driver, ``eo`` commands; see docs/deployment.md).
    :param ledger_conn_id: an Airflow ``eo_ledger`` or ``postgres`` connection whose URL
        replaces ``ledger_url``.
    :param aws_conn_id: an Airflow ``aws`` connection (read with the Amazon provider's hook)
        whose credentials, region and endpoint open an ``s3a://`` ``staging_dir`` when neither
        ``spark_conf``'s ``spark.hadoop.fs.s3a.*`` nor the ``AWS_*`` environment give them
        (:mod:`airflow_provider_eo.staging_fs`). Its secrets never go into Spark conf.
    :param aws_settings: filled by the connection machinery from ``aws_conn_id``
        (:func:`airflow_provider_eo.connections.apply_settings`); not set by users, never
        serialized by :meth:`to_json`.
    :param staging_dir: where prepared output is staged until it is committed: a folder
        every Spark executor, the driver and the committer share, or an object-store URI
        (``s3a://BUCKET/PATH``, ``gs://``, ``abfss://``, ``hdfs://``; see docs/object-storage.md).
    :param max_records_per_checkpoint: cap of offsets planned per checkpoint (all partitions);
        default :data:`DEFAULT_MAX_RECORDS_PER_CHECKPOINT`. A stream's steady checkpoints are
        as small as an interval's input; the cap sizes the checkpoints that catch up a backlog.
        Plan also keeps a checkpoint small enough that its commit publishes within half of
        ``transaction_timeout_ms``, at the rate measured from the pipeline's recent commits
        (5,000 offsets/s assumed until one is measured): a bigger one would be aborted by the
        broker every time it is committed. The plan's ledger event says when this cut it.
    :param startup: where to start partitions the ledger has never seen.
    :param consumer_group: the group whose offsets the commit moves (for lag monitoring).
    :param transactional_id_prefix: prefix of the stable ``{prefix}.{pipeline}.{shard}`` ids.
    :param commit_shards: number of commit transactions per checkpoint (each owns a set of
        sink partitions); 1 makes the whole checkpoint one transaction.
    :param commit_mode: where the commit's shard transactions run: ``"local"`` (in the
        committing process, one after another), ``"spark"`` (each in a Spark task on an
        executor; the committing process publishes nothing) or ``"auto"`` (the default:
        ``spark`` when the Spark master is a cluster and the checkpoint has at least
        ``spark_commit_min_records`` records, else ``local``).
    :param spark_commit_min_records: the smallest checkpoint ``auto`` commits on a cluster.
        A checkpoint below it is also staged by the Spark driver (its output collected as
        Arrow, the staged files written there) instead of by a Parquet write job; ``0``
        stages every checkpoint on the executors.
    :param transaction_timeout_ms: ``transaction.timeout.ms`` of the commit producers.
    :param on_data_loss: ``fail`` (default) or ``skip`` when retention deleted planned offsets.
    :param spark_conf: extra Spark settings (``spark.master`` etc.).
    :param sink_max_message_bytes: the sink's ``max.message.bytes`` when it cannot be read
        from the broker (records larger than this are refused at prepare time).
    :param keep_committed_staging: how many committed checkpoints' staging folders to keep.
    :param max_pending: how many checkpoints may be unfinished (PLANNED or PREPARED) at once.
    :param dead_letter_topic: topic that takes the source records the transform fails on,
        or whose output the sink refuses as too large (``max.message.bytes``): each is
        published there in the same Kafka transaction as the checkpoint's output, with
        headers naming the error, the source position, the pipeline and the checkpoint.
        Used only when ``max_dead_letters_per_checkpoint`` is above 0.
    :param max_dead_letters_per_checkpoint: how many source records one checkpoint may send
        to ``dead_letter_topic``; one more fails the prepare with the error naming the
        record (0, the default: the first such record fails the prepare).
    :param notifiers: Airflow notifiers (``BaseNotifier`` instances, or any callable taking
        a context) per event: ``{"checkpoint_aborted": [...], "data_loss": [...],
        "dead_letters": [...], "stream_stalled": [...]}``. The Airflow task that sees the
        event calls each with its context plus ``context["eo"]`` (pipeline, checkpoint id,
        reason, counts); a notifier that raises is logged and changes nothing else. They
        stay on the Airflow side: :meth:`to_json` (what a Spark driver gets) leaves them out.
    :param notify_dead_letters_above: ``dead_letters`` notifies when a committed checkpoint
        sent more than this many records to the dead-letter topic (0: any).
    :param backfill_of: set only on a backfill pipeline (derived by
        :func:`airflow_provider_eo.core.backfill.backfill_pipeline`): the name of the live
        pipeline whose COMMITTED ranges it re-processes.
    """

    name: str
    kafka: Mapping[str, Any] = field(default_factory=dict)
    source_topics: Sequence[str] = ()
    sink_topic: str = ""
    transform: str | None = None
    ledger_url: str = DEFAULT_LEDGER_URL
    staging_dir: str = ".eo/staging"
    max_records_per_checkpoint: int = DEFAULT_MAX_RECORDS_PER_CHECKPOINT
    startup: Startup = field(default_factory=Startup)
    consumer_group: str | None = None
    transactional_id_prefix: str = "eo"
    commit_shards: int = 1
    commit_mode: Literal["local", "spark", "auto"] = "auto"
    spark_commit_min_records: int = 1_000_000
    transaction_timeout_ms: int = 60_000
    on_data_loss: Literal["fail", "skip"] = "fail"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    sink_max_message_bytes: int = 1_048_588
    keep_committed_staging: int = 0
    max_pending: int = 1
    dead_letter_topic: str | None = None
    max_dead_letters_per_checkpoint: int = 0
    backfill_of: str | None = None
    kafka_conn_id: str | None = None
    ledger_conn_id: str | None = None
    notifiers: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    notify_dead_letters_above: int = 0
    aws_conn_id: str | None = None
    aws_settings: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name or ""):
            raise PipelineConfigError(
                f"pipeline name {self.name!r} is invalid: use 1-100 letters, digits, '.', '_' "
                "or '-' (it becomes part of transactional ids and group names)"
            )
        if isinstance(self.source_topics, str):
            raise PipelineConfigError(
                f"pipeline {self.name!r}: source_topics must be a list, e.g. [{self.source_topics!r}]"
            )
        if not self.source_topics:
            raise PipelineConfigError(f"pipeline {self.name!r}: source_topics is empty")
        if not self.sink_topic:
            raise PipelineConfigError(f"pipeline {self.name!r}: sink_topic is required")
        if self.sink_topic in self.source_topics:
            raise PipelineConfigError(
                f"pipeline {self.name!r}: sink_topic {self.sink_topic!r} is also a source topic; "
                "a pipeline that reads its own output never finishes a checkpoint"
            )
        if not self.kafka.get("bootstrap.servers") and not self.kafka_conn_id:
            raise PipelineConfigError(
                f"pipeline {self.name!r}: kafka config needs 'bootstrap.servers' (or "
                "kafka_conn_id=<an Airflow kafka connection that has it>)"
            )
        for key, why in _FORBIDDEN_CLIENT_KEYS.items():
            if key in self.kafka:
                raise PipelineConfigError(
                    f"pipeline {self.name!r}: remove {key!r} from the kafka config: {why}"
                )
        if self.max_records_per_checkpoint < 1:
            raise PipelineConfigError(f"pipeline {self.name!r}: max_records_per_checkpoint must be >= 1")
        if self.commit_shards < 1:
            raise PipelineConfigError(f"pipeline {self.name!r}: commit_shards must be >= 1")
        if self.max_pending < 1:
            raise PipelineConfigError(f"pipeline {self.name!r}: max_pending must be >= 1")
        if self.commit_mode not in COMMIT_MODES:
            raise PipelineConfigError(
                f"pipeline {self.name!r}: commit_mode={self.commit_mode!r} must be one of "
                f"{', '.join(COMMIT_MODES)}"
            )
        if self.spark_commit_min_records < 0:
            raise PipelineConfigError(f"pipeline {self.name!r}: spark_commit_min_records must be >= 0")
        self._check_dead_letters()
        self._check_notifiers()
        if not 1_000 <= self.transaction_timeout_ms <= BROKER_MAX_TRANSACTION_TIMEOUT_MS:
            raise PipelineConfigError(
                f"pipeline {self.name!r}: transaction_timeout_ms={self.transaction_timeout_ms} "
                f"must be between 1000 and the broker's transaction.max.timeout.ms "
                f"(default {BROKER_MAX_TRANSACTION_TIMEOUT_MS})"
            )
        message_timeout = int(self.kafka.get("message.timeout.ms", 0) or 0)
        if message_timeout and message_timeout >= self.transaction_timeout_ms:
            raise PipelineConfigError(
                f"pipeline {self.name!r}: message.timeout.ms ({message_timeout}) must be below "
                f"transaction_timeout_ms ({self.transaction_timeout_ms})"
            )
        if self.on_data_loss not in ("fail", "skip"):
            raise PipelineConfigError(f"pipeline {self.name!r}: on_data_loss must be 'fail' or 'skip'")
        if self.transform is not None and ":" not in self.transform:
            raise PipelineConfigError(
                f"pipeline {self.name!r}: transform {self.transform!r} must be 'module:function'"
            )

    def _check_dead_letters(self) -> None:
        if self.max_dead_letters_per_checkpoint < 0:
            raise PipelineConfigError(
                f"pipeline {self.name!r}: max_dead_letters_per_checkpoint must be >= 0 (0 sends none)"
            )
        if self.max_dead_letters_per_checkpoint and not self.dead_letter_topic:
            raise PipelineConfigError(
                f"pipeline {self.name!r}: max_dead_letters_per_checkpoint="
                f"{self.max_dead_letters_per_checkpoint} needs dead_letter_topic=<topic>"
            )
        topic = self.dead_letter_topic
        if topic is not None and (topic == self.sink_topic or topic in self.source_topics):
            raise PipelineConfigError(
                f"pipeline {self.name!r}: dead_letter_topic {topic!r} must be a topic of its own, "
                "neither the sink nor a source topic"
            )

    def _check_notifiers(self) -> None:
        for event, notifiers in self.notifiers.items():
            if event not in NOTIFY_EVENTS:
                raise PipelineConfigError(
                    f"pipeline {self.name!r}: notifiers names the event {event!r}; use "
                    f"{', '.join(NOTIFY_EVENTS)}"
                )
            if isinstance(notifiers, (str, bytes)) or not isinstance(notifiers, Sequence):
                raise PipelineConfigError(
                    f"pipeline {self.name!r}: notifiers[{event!r}] must be a list of notifiers, "
                    f"e.g. [SmtpNotifier(...)]"
                )
            for notifier in notifiers:
                if not callable(notifier):
                    raise PipelineConfigError(
                        f"pipeline {self.name!r}: notifiers[{event!r}] holds {notifier!r}, which is "
                        "not callable; give an Airflow BaseNotifier (or a function taking the context)"
                    )
        if self.notify_dead_letters_above < 0:
            raise PipelineConfigError(f"pipeline {self.name!r}: notify_dead_letters_above must be >= 0")

    @property
    def dead_letters_enabled(self) -> bool:
        """Whether records may go to :attr:`dead_letter_topic` (a topic and a budget above 0)."""
        return self.dead_letter_topic is not None and self.max_dead_letters_per_checkpoint > 0

    @property
    def connection_ids(self) -> dict[str, str]:
        """The Airflow connections this pipeline still reads its settings from (empty once
        they are applied: see :mod:`airflow_provider_eo.connections`)."""
        ids = {
            "kafka_conn_id": self.kafka_conn_id,
            "ledger_conn_id": self.ledger_conn_id,
            "aws_conn_id": self.aws_conn_id,
        }
        return {k: v for k, v in ids.items() if v}

    @property
    def group_id(self) -> str:
        """The consumer group whose offsets each commit moves."""
        return self.consumer_group or f"eo.{self.name}"

    def fingerprint(self) -> str:
        """Hash of the settings that must not change silently between checkpoints."""
        doc = {
            "source_topics": sorted(self.source_topics),
            "sink_topic": self.sink_topic,
            "transform": self.transform,
        }
        if self.backfill_of is not None:  # only then: a live pipeline's hash stays as it was
            doc["backfill_of"] = self.backfill_of
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]

    def to_json(self, *, callables: Literal["keep", "skip"] = "keep") -> str:
        """Serialize for a spark-submit argument (secrets included: never log this). The
        ``notifiers`` and ``notify_dead_letters_above`` are left out: only Airflow tasks
        notify, and a notifier is not JSON. ``callables="skip"`` leaves out Kafka settings
        whose values are not JSON (a callback), which ``"keep"`` hands to ``json.dumps``."""
        kafka = dict(self.kafka)
        if callables == "skip":
            kafka = {k: v for k, v in kafka.items() if v is None or isinstance(v, (str, int, float, bool))}
        doc = {
            "name": self.name,
            "kafka": kafka,
            "source_topics": list(self.source_topics),
            "sink_topic": self.sink_topic,
            "transform": self.transform,
            "ledger_url": self.ledger_url,
            "staging_dir": self.staging_dir,
            "max_records_per_checkpoint": self.max_records_per_checkpoint,
            "startup": {
                "mode": self.startup.mode,
                "timestamp_ms": self.startup.timestamp_ms,
                "offsets": {
                    t: {str(p): o for p, o in parts.items()}
                    for t, parts in (self.startup.offsets or {}).items()
                },
                "fallback": self.startup.fallback,
            },
            "consumer_group": self.consumer_group,
            "transactional_id_prefix": self.transactional_id_prefix,
            "commit_shards": self.commit_shards,
            "commit_mode": self.commit_mode,
            "spark_commit_min_records": self.spark_commit_min_records,
            "transaction_timeout_ms": self.transaction_timeout_ms,
            "on_data_loss": self.on_data_loss,
            "spark_conf": dict(self.spark_conf),
            "sink_max_message_bytes": self.sink_max_message_bytes,
            "keep_committed_staging": self.keep_committed_staging,
            "max_pending": self.max_pending,
            "dead_letter_topic": self.dead_letter_topic,
            "max_dead_letters_per_checkpoint": self.max_dead_letters_per_checkpoint,
            "backfill_of": self.backfill_of,
            "kafka_conn_id": self.kafka_conn_id,
            "ledger_conn_id": self.ledger_conn_id,
        }
        if self.aws_conn_id:  # only then: the document of a pipeline without one is unchanged
            doc["aws_conn_id"] = self.aws_conn_id
        return json.dumps(doc)

    def public_settings(self) -> tuple[str, list[str]]:
        """:meth:`to_json` with every secret left out, for what is stored outside this process
        (an Airflow trigger's kwargs), and the names of the settings left out: the Kafka
        settings that are secrets (:func:`is_secret_kafka_setting`) or not JSON (a callback),
        and ``ledger_url``'s password (``"ledger_url.password"``). :meth:`from_json` reads it
        back; connections (``kafka_conn_id``/``ledger_conn_id``) can supply what was left out."""
        from sqlalchemy.engine import make_url

        doc = json.loads(self.to_json(callables="skip"))
        withheld = sorted(
            k
            for k, v in self.kafka.items()
            if is_secret_kafka_setting(k) or k not in doc["kafka"] or doc["kafka"][k] != v
        )
        doc["kafka"] = {k: v for k, v in doc["kafka"].items() if k not in withheld}
        try:
            url = make_url(self.ledger_url)
        except Exception:  # not a URL SQLAlchemy parses: the ledger refuses it later, loudly
            url = None
        if url is not None and url.password:
            doc["ledger_url"] = url._replace(password=None).render_as_string(hide_password=False)
            withheld.append("ledger_url.password")
        return json.dumps(doc), withheld

    @classmethod
    def from_json(cls, text: str) -> Pipeline:
        """Inverse of :meth:`to_json`."""
        doc = json.loads(text)
        st = doc.pop("startup")
        offsets = st.get("offsets") or None
        startup = Startup(
            mode=st["mode"],
            timestamp_ms=st.get("timestamp_ms"),
            offsets={t: {int(p): int(o) for p, o in ps.items()} for t, ps in offsets.items()}
            if offsets
            else None,
            fallback=st.get("fallback", "earliest"),
        )
        return cls(startup=startup, **doc)


def load_pipeline(ref: str) -> Pipeline:
    """Import ``module:attr`` and return the :class:`Pipeline` there (or a callable's result,
    or the ``as_pipeline()`` of an object that has one, e.g. a Structured Streaming sink)."""
    if ":" not in ref:
        raise PipelineConfigError(f"{ref!r} is not MODULE:ATTR (e.g. mypkg.pipelines:ORDERS)")
    module_name, attr = ref.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PipelineConfigError(f"cannot import {module_name!r} for {ref!r}: {exc}") from exc
    obj = getattr(module, attr, None)
    as_pipeline = getattr(obj, "as_pipeline", None)
    if callable(as_pipeline) and not isinstance(obj, Pipeline):
        obj = as_pipeline()
    elif callable(obj) and not isinstance(obj, Pipeline):
        obj = obj()
    if not isinstance(obj, Pipeline):
        raise PipelineConfigError(f"{ref!r} is not a Pipeline (got {type(obj).__name__})")
    return obj


_BACKFILL_HASH_CHARS = 10


def backfill_name(live: str, target: str) -> str:
    """The name of the backfill pipeline of ``live`` into sink ``target``: ``<live>.bf.<target>``,
    or, when that is longer than a pipeline name may be (or not a valid one), a readable
    prefix of it plus a short hash of the pair, so one (live, target) always has one name."""
    full = f"{live}.bf.{target}"
    if _NAME.match(full):
        return full
    digest = hashlib.sha256(f"{live}\0{target}".encode()).hexdigest()[:_BACKFILL_HASH_CHARS]
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", full)[: 100 - _BACKFILL_HASH_CHARS - 1]
    return f"{readable}-{digest}"
