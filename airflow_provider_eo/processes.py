"""Process checks shared by the local stack (the broker's pid) and streaming mode (a stream
run's pid on this host). Never imports Airflow or Spark."""

from __future__ import annotations

import os
from pathlib import Path


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` of this host exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); look at its state where /proc exists.
    stat = Path(f"/proc/{pid}/stat")
    if stat.is_file():
        try:
            return stat.read_text().rsplit(") ", 1)[1][0] != "Z"
        except (OSError, IndexError):
            return True
    return True


def _start_ticks(pid: int) -> str | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field
    22); None when it does not exist (or there is no /proc)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _machine() -> str | None:
    """This boot of this machine and this process's pid namespace: two processes can be
    compared by pid only when both are the same (a pid names another process in another
    container, on another host, after a reboot). None without /proc."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:12]
        namespace = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        return None
    return f"{boot}.{namespace}"


def process_tag() -> str:
    """What tells this process apart from every other process that ever had its pid:
    ``<boot>.<pid namespace>.<start time>`` ("" where there is no /proc). With the pid it
    lets another process of the same machine and namespace decide that this one is gone
    (:func:`process_gone`)."""
    machine, start = _machine(), _start_ticks(os.getpid())
    return f"{machine}.{start}" if machine and start else ""


def process_gone(pid: int, tag: str) -> bool:
    """True only when it is certain that process ``pid`` tagged ``tag`` (:func:`process_tag`)
    no longer runs: it ran on this boot of this machine, in this process's pid namespace, and
    no process has that pid any more, or the one that has it started at another time (the
    pid was reused), or it is a zombie (dead, not reaped yet). False when it runs, or when
    that cannot be judged from here (another host, container or boot; no /proc)."""
    machine, _, start = tag.rpartition(".")
    if not machine or machine != _machine():
        return False
    if _start_ticks(pid) != start:
        return True
    return not pid_alive(pid)
