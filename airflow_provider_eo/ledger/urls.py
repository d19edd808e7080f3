"""Ledger URLs: the default, where a relative SQLite file lives, and redaction (no
password is ever printed or logged).

A relative SQLite path (``sqlite:///ledger.db``, ``sqlite:///eo-ledger.db``) resolves
against the provider's home folder (``$EO_HOME``, else ``<checkout>/.eo`` when running
from a source checkout, else ``~/.eo``: see :func:`airflow_provider_eo.paths.eo_home`),
never against the working directory: a task or CLI started elsewhere must open the same
ledger file, not a second, empty one (a new ledger would re-publish or, worse, skip by
foreign markers).

A SQLite ledger on a network filesystem (NFS, SMB/CIFS, sshfs, 9p, ...) is refused
(:func:`check_sqlite_location`): SQLite's WAL needs memory shared by every process that
opens the file, and its file locks are not reliable there, so two workers could both win
one transition or corrupt the file. The filesystem is the one mounted at the longest
mount point that is a prefix of the file's folder, read from ``/proc/self/mountinfo``
(where that file is missing, e.g. on macOS, nothing is checked). There is no override:
a local path for the file, or PostgreSQL, always exists.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from airflow_provider_eo.errors import LedgerOnNetworkFilesystem as LedgerOnNetworkFilesystem
from airflow_provider_eo.paths import eo_home

DEFAULT_LEDGER_URL = "sqlite:///ledger.db"
"""The embedded default: ``<eo home>/ledger.db`` (see :func:`resolve_ledger_url`)."""
ENV_LEDGER_URL = "EO_LEDGER_URL"

_PASSWORD_IN_URL = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.\-]*://[^:/@\s]*:)[^@\s]*@")


def default_ledger_url() -> str:
    """``$EO_LEDGER_URL``, else the embedded SQLite file ``<eo home>/ledger.db``."""
    return os.environ.get(ENV_LEDGER_URL) or DEFAULT_LEDGER_URL


def resolve_ledger_url(url: str) -> str:
    """``url`` with a relative SQLite file path made absolute against the eo home
    (``~`` expanded); every other URL (PostgreSQL, in-memory or ``file:`` URI SQLite,
    absolute paths) is returned unchanged. The ledger opens only resolved URLs."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return url
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:") or database.startswith("file:"):
        return url
    path = Path(database).expanduser()
    if path.is_absolute():
        if str(path) == database:
            return url
    else:
        path = eo_home() / path
    return parsed.set(database=str(path)).render_as_string(hide_password=False)


def describe_ledger_url(url: str) -> str:
    """The resolved, redacted URL: what ``eo`` prints as ``ledger: ...``."""
    return redact_url(resolve_ledger_url(url))


def redact_url(url: str | object) -> str:
    """The URL with its password replaced by ``***``; safe to print and log."""
    text = str(url) if not isinstance(url, str) else url
    try:
        parsed = make_url(text)
    except (ArgumentError, ValueError):
        return _PASSWORD_IN_URL.sub(r"\g<head>***@", text)
    return parsed.render_as_string(hide_password=True)


def redact_text(text: str, url: str | object) -> str:
    """``text`` with the URL's password (if any) masked, e.g. a driver error message."""
    try:
        password = make_url(str(url)).password
    except (ArgumentError, ValueError):
        password = None
    if password:
        text = text.replace(str(password), "***")
    return _PASSWORD_IN_URL.sub(r"\g<head>***@", text)


# -- SQLite on a network filesystem -----------------------------------------------------------

MOUNTINFO = Path("/proc/self/mountinfo")

#: Filesystem types (``/proc/self/mountinfo``'s names) whose locks or shared memory SQLite
#: cannot rely on: network and cluster filesystems, and FUSE mounts of remote storage.
NETWORK_FILESYSTEMS: frozenset[str] = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ncpfs",
        "9p",
        "afs",
        "coda",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "davfs",
        "fuse.sshfs",
        "fuse.glusterfs",
        "fuse.ceph-fuse",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.rclone",
        "fuse.davfs2",
    }
)

_MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of ``/proc/self/mountinfo``: where a filesystem is mounted, its type and
    source (e.g. ``nfs4``, ``server:/export``)."""

    mount_point: str
    fstype: str
    source: str

    @property
    def network(self) -> bool:
        """True for the filesystem types in :data:`NETWORK_FILESYSTEMS`."""
        return self.fstype in NETWORK_FILESYSTEMS


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes (\040 ...).
    return _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts listed in a ``/proc/<pid>/mountinfo`` text, in its order; malformed lines
    are skipped."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 2:
            continue
        mounts.append(Mount(mount_point=_unescape(fields[4]), fstype=rest[0], source=_unescape(rest[1])))
    return mounts


def mount_of(folder: str | Path, mounts: list[Mount]) -> Mount | None:
    """The mount holding ``folder`` (absolute, symlinks resolved): the one at the longest
    mount point that is ``folder`` or one of its parents; of several at the same point, the
    last (it is mounted over the others). None when no mount matches."""
    path = os.path.normpath(str(folder))
    best: Mount | None = None
    for mount in mounts:
        point = os.path.normpath(mount.mount_point)
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(os.path.normpath(best.mount_point))):
            best = mount
    return best


def _file_of(database: str) -> str:
    """The file path of a SQLite database name, also of a ``file:`` URI (query dropped)."""
    if not database.startswith("file:"):
        return database
    rest = database[len("file:") :].split("?", 1)[0]
    if rest.startswith("//"):  # file://host/path: the path starts at the third slash
        rest = "/" + rest[2:].partition("/")[2]
    return rest


def check_sqlite_location(database: str | Path, *, mountinfo: str | None = None) -> None:
    """Refuse a SQLite ledger file on a network filesystem (:class:`LedgerOnNetworkFilesystem`,
    naming the file, the filesystem type and mount, and what to do instead).

    ``database`` need not exist yet: its nearest existing folder decides. ``mountinfo`` is
    the text of ``/proc/self/mountinfo`` (read when None; no check where it is missing).
    """
    if mountinfo is None:
        try:
            mountinfo = MOUNTINFO.read_text(encoding="utf-8", errors="surrogateescape")
        except OSError:
            return
    file = Path(_file_of(str(database))).expanduser()
    folder = Path(os.path.realpath(file.parent))  # a symlink into a network mount counts
    mount = mount_of(folder, parse_mountinfo(mountinfo))
    if mount is None or not mount.network:
        return
    raise LedgerOnNetworkFilesystem(
        f"the SQLite ledger {file} would be on a network filesystem ({mount.fstype} "
        f"{mount.source} mounted at {mount.mount_point}): SQLite's WAL and file locks are not "
        "reliable there, so two workers could both win one checkpoint transition or corrupt "
        "the ledger; nothing was opened or created. Put the ledger on a local disk "
        "(EO_LEDGER_URL=sqlite:////local/path/ledger.db, or EO_HOME=/local/path for the "
        "default ledger.db), or use PostgreSQL (EO_LEDGER_URL=postgresql+psycopg://...), "
        "which workers on several hosts need anyway."
    )
