"""Airflow hook for the checkpoint ledger: turns an Airflow connection into a Ledger."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL

from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.ledger.urls import redact_url
from airflow_provider_eo.version_compat import BaseHook

if TYPE_CHECKING:
    from airflow_provider_eo.ledger.store import Ledger

_SQLITE_TYPES = {"sqlite", "eo_ledger_sqlite"}
_DRIVER = "postgresql+psycopg"

#: libpq connection parameters a ``postgres`` connection's extra may carry (as the Postgres
#: provider's connection form documents them); they go into the URL's query, which psycopg
#: passes to libpq.
LIBPQ_EXTRAS = frozenset(
    {
        "sslmode",
        "sslcert",
        "sslkey",
        "sslpassword",
        "sslrootcert",
        "sslcrl",
        "sslcrldir",
        "sslsni",
        "sslcompression",
        "ssl_min_protocol_version",
        "ssl_max_protocol_version",
        "gssencmode",
        "krbsrvname",
        "gsslib",
        "requirepeer",
        "require_auth",
        "channel_binding",
        "connect_timeout",
        "client_encoding",
        "options",
        "application_name",
        "fallback_application_name",
        "keepalives",
        "keepalives_idle",
        "keepalives_interval",
        "keepalives_count",
        "tcp_user_timeout",
        "target_session_attrs",
        "load_balance_hosts",
        "service",
        "passfile",
    }
)
#: Extra keys of the Postgres provider's form that are not libpq parameters.
_PROVIDER_ONLY_EXTRAS = frozenset(
    {
        "cursor",
        "sqlalchemy_scheme",
        "sqlalchemy_query",
        "enable_log_db_messages",
        "aws_conn_id",
        "azure_conn_id",
        "cluster-identifier",
        "port",
        "region_name",
        "redshift",
        "redshift-serverless",
    }
)


class LedgerHook(BaseHook):
    """Open the checkpoint ledger named by an Airflow connection.

    The URL comes from, in order: the ``sqlalchemy_url`` argument; the connection's extra
    ``sqlalchemy_url``; else the connection's fields. Any connection type works the same
    way, so an existing ``postgres`` (common-sql) connection can be the ledger. The
    connection form is declared in the provider info (``conn-fields``,
    ``ui-field-behaviour``), as Airflow >= 3.2 reads it. With extra ``{"dialect": "sqlite"}``
    (or a host that is a ``.db`` file path and no port) ``host`` holds the SQLite file
    path; otherwise host/port/schema/login/password make a ``postgresql+psycopg`` URL.

    :param eo_ledger_conn_id: Airflow connection id.
    :param sqlalchemy_url: a raw SQLAlchemy URL; when set, no connection is looked up.
    :param create: passed to :class:`~airflow_provider_eo.ledger.Ledger`.
    """

    conn_name_attr = "eo_ledger_conn_id"
    default_conn_name = "eo_ledger_default"
    conn_type = "eo_ledger"
    hook_name = "EO checkpoint ledger"

    def __init__(
        self,
        eo_ledger_conn_id: str = default_conn_name,
        *,
        sqlalchemy_url: str | None = None,
        create: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.eo_ledger_conn_id = eo_ledger_conn_id
        self.sqlalchemy_url = sqlalchemy_url
        self.create = create
        self._ledger: Ledger | None = None

    def get_url(self) -> str:
        """The SQLAlchemy URL of the ledger (with password: never log it, log
        :func:`~airflow_provider_eo.ledger.redact_url` of it)."""
        if self.sqlalchemy_url:
            return self.sqlalchemy_url
        conn = self.get_connection(self.eo_ledger_conn_id)
        extra = conn.extra_dejson or {}
        if extra.get("sqlalchemy_url"):
            return str(extra["sqlalchemy_url"])
        dialect = str(extra.get("dialect") or "").lower()
        host = conn.host or ""
        looks_like_file = not conn.port and (host.startswith(("/", ".")) or host.endswith(".db"))
        if dialect in _SQLITE_TYPES or (not dialect and looks_like_file):
            if not host:
                raise ConfigError(
                    f"connection {self.eo_ledger_conn_id!r}: a SQLite ledger needs the file "
                    "path in the host field"
                )
            return f"sqlite:///{host}"
        if extra.get("iam"):
            raise ConfigError(
                f"connection {self.eo_ledger_conn_id!r}: IAM authentication (extra 'iam') is not "
                "supported for the ledger; give it a password, or a full URL in the extra "
                "'sqlalchemy_url'"
            )
        driver = str(extra.get("driver") or _DRIVER)
        query = {k: str(v) for k, v in extra.items() if k in LIBPQ_EXTRAS and v is not None}
        unknown = sorted(
            k
            for k in extra
            if k not in LIBPQ_EXTRAS
            and k not in _PROVIDER_ONLY_EXTRAS
            and k not in {"driver", "dialect", "sqlalchemy_url", "iam"}
        )
        if unknown:
            self.log.warning(
                "connection %s: ignoring extra %s (not a libpq connection parameter)",
                self.eo_ledger_conn_id,
                unknown,
            )
        return URL.create(
            drivername=driver,
            username=conn.login or None,
            password=conn.password or None,
            host=host or None,
            port=conn.port or None,
            database=conn.schema or None,
            query=query,
        ).render_as_string(hide_password=False)

    def get_ledger(self) -> Ledger:
        """The Ledger, created on first use and reused afterwards."""
        if self._ledger is None:
            from airflow_provider_eo.ledger.store import Ledger

            url = self.get_url()
            self.log.info("opening the checkpoint ledger at %s", redact_url(url))
            self._ledger = Ledger(url, create=self.create)
        return self._ledger

    def test_connection(self) -> tuple[bool, str]:
        """Used by the Airflow UI's "Test" button."""
        try:
            ledger = self.get_ledger()
            revision = ledger.current_revision()
        except Exception as exc:
            return False, str(exc)
        return True, f"ledger at {ledger.url} reachable, schema revision {revision}"
