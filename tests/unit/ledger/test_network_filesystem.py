"""A SQLite ledger on a network filesystem is refused: detection from a mountinfo text."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_eo.errors import ConfigError
from airflow_provider_eo.ledger import Ledger, LedgerError
from airflow_provider_eo.ledger import urls as ledger_urls
from airflow_provider_eo.ledger.urls import (
    LedgerOnNetworkFilesystem,
    Mount,
    check_sqlite_location,
    mount_of,
    parse_mountinfo,
)

# A workstation: local root, an NFS home, an SMB share with a space in its mount point, a
# local disk mounted inside the NFS home, WSL's 9p drive, an sshfs mount, and /data mounted
# twice (a local disk, then NFS over it).
MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
60 27 0:50 / /home rw,relatime shared:30 - nfs4 files:/export/home rw,vers=4.2
61 60 8:17 / /home/ann/scratch rw,relatime - xfs /dev/sdb1 rw
62 27 0:51 / /mnt/team\\040share rw,relatime - cifs //nas/team rw,vers=3.1.1
63 27 0:52 / /mnt/c rw,noatime - 9p drvfs rw,dirsync
64 27 0:53 / /mnt/remote rw,nosuid,nodev - fuse.sshfs ann@box:/srv rw,user_id=1000
65 27 8:33 / /data rw,relatime - ext4 /dev/sdc1 rw
66 27 0:54 / /data rw,relatime - nfs filer:/data rw,vers=3
67 27 0:55 / /homework rw,relatime - ext4 /dev/sdd1 rw
this line is not a mount
"""


def test_parse_mountinfo_reads_point_type_and_source() -> None:
    mounts = parse_mountinfo(MOUNTINFO)
    assert len(mounts) == 10  # the malformed last line is skipped
    assert mounts[2] == Mount("/home", "nfs4", "files:/export/home")
    assert mounts[4] == Mount("/mnt/team share", "cifs", "//nas/team")  # \040 is a space


@pytest.mark.parametrize(
    ("folder", "point", "fstype"),
    [
        ("/home/ann/.eo", "/home", "nfs4"),
        ("/home", "/home", "nfs4"),
        ("/home/ann/scratch/eo", "/home/ann/scratch", "xfs"),  # the longer mount point wins
        ("/homework/eo", "/homework", "ext4"),
        ("/home2/eo", "/", "ext4"),  # /home is not a parent of /home2
        ("/mnt/team share/eo", "/mnt/team share", "cifs"),
        ("/mnt/c/Users/ann", "/mnt/c", "9p"),
        ("/mnt/remote/x", "/mnt/remote", "fuse.sshfs"),
        ("/data/ledger", "/data", "nfs"),  # mounted over the local disk: the last one
        ("/var/lib/eo", "/", "ext4"),
    ],
)
def test_mount_of_is_the_longest_mount_point_prefix(folder: str, point: str, fstype: str) -> None:
    mount = mount_of(folder, parse_mountinfo(MOUNTINFO))
    assert mount is not None and (mount.mount_point, mount.fstype) == (point, fstype)


@pytest.mark.parametrize(
    ("database", "fstype", "source"),
    [
        ("/home/ann/.eo/ledger.db", "nfs4", "files:/export/home"),
        ("/home/ann/.eo/not/yet/made/ledger.db", "nfs4", "files:/export/home"),
        ("/mnt/team share/ledger.db", "cifs", "//nas/team"),
        ("/mnt/c/Users/ann/ledger.db", "9p", "drvfs"),
        ("/mnt/remote/ledger.db", "fuse.sshfs", "ann@box:/srv"),
        ("/data/ledger.db", "nfs", "filer:/data"),
        ("file:/home/ann/ledger.db?mode=rwc", "nfs4", "files:/export/home"),
    ],
)
def test_network_filesystems_are_refused_with_path_type_and_remedy(
    database: str, fstype: str, source: str
) -> None:
    with pytest.raises(LedgerOnNetworkFilesystem) as info:
        check_sqlite_location(database, mountinfo=MOUNTINFO)
    message = str(info.value)
    shown = database.removeprefix("file:").split("?")[0]
    assert f"the SQLite ledger {shown} would be on a network filesystem ({fstype} {source}" in message
    assert "PostgreSQL" in message and "local disk" in message and "nothing was opened" in message
    assert isinstance(info.value, LedgerError) and isinstance(info.value, ConfigError)


@pytest.mark.parametrize(
    "database",
    ["/var/lib/eo/ledger.db", "/home/ann/scratch/ledger.db", "/home2/ledger.db", "relative.db"],
)
def test_local_filesystems_pass(database: str) -> None:
    check_sqlite_location(database, mountinfo=MOUNTINFO)


def test_a_symlink_into_a_network_mount_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "remote"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    fake = f"1 0 0:1 / / rw - ext4 /dev/vda rw\n2 1 0:2 / {target} rw - nfs4 filer:/x rw\n"
    with pytest.raises(LedgerOnNetworkFilesystem, match="nfs4 filer:/x"):
        check_sqlite_location(tmp_path / "link" / "ledger.db", mountinfo=fake)


def test_opening_a_ledger_there_creates_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    share = tmp_path / "share"
    share.mkdir()
    fake = tmp_path / "mountinfo"
    fake.write_text(f"1 0 0:1 / / rw - ext4 /dev/vda rw\n2 1 0:2 / {share} rw - cifs //nas/x rw\n")
    monkeypatch.setattr(ledger_urls, "MOUNTINFO", fake)
    path = share / "eo" / "ledger.db"
    with pytest.raises(LedgerOnNetworkFilesystem, match=f"the SQLite ledger {path} would be on"):
        Ledger(f"sqlite:///{path}")
    assert list(share.iterdir()) == []
    Ledger(f"sqlite:///{tmp_path / 'local' / 'ledger.db'}").close()  # beside it, on the local disk


def test_without_mountinfo_nothing_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_urls, "MOUNTINFO", tmp_path / "missing")
    check_sqlite_location("/anything/ledger.db")
