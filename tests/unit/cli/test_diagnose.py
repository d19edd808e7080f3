"""``eo abort`` and ``eo recover`` against a real SQLite ledger and a fake Kafka: refused while
a committer holds a live commit lease, naming ``--force-live`` as the way out; with the flag,
the lease is taken and the committer's ids are fenced."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from eo_fake_kafka import FakeBroker, FakeClients, fake_pipeline, patched_broker, prepared_checkpoint
from eo_ledgers import LedgerFactory
from typer.testing import CliRunner

from airflow_provider_eo import cli
from airflow_provider_eo.cli import diagnose
from airflow_provider_eo.core import abort, recover
from airflow_provider_eo.ledger import CheckpointState, Ledger
from airflow_provider_eo.pipeline import Pipeline

OUT = "out"
OUTPUT = {0: [b"a0"], 1: [b"b0", b"b1"]}
COMMITTER = "eo.orders"


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    return fake_pipeline(tmp_path, sink=OUT, shards=2)


@pytest.fixture
def ledger(make_ledger: LedgerFactory) -> Ledger:
    return make_ledger(pipeline="orders")


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch, pipeline: Pipeline, ledger: Ledger) -> FakeBroker:
    """The fake broker, and the commands wired to it and to ``ledger``."""
    fake = patched_broker(monkeypatch, {OUT: 2})

    @contextmanager
    def opened(ref: str) -> Iterator[tuple[Pipeline, Ledger]]:
        yield pipeline, ledger

    clients = FakeClients(fake)
    monkeypatch.setattr(diagnose, "opened", opened)
    monkeypatch.setattr(abort, "abort_checkpoint", functools.partial(abort.abort_checkpoint, clients=clients))
    monkeypatch.setattr(
        recover, "recover_pipeline", functools.partial(recover.recover_pipeline, clients=clients)
    )
    return fake


def _run(*argv: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.app, list(argv))
    return result.exit_code, " ".join(result.stderr.split())


@pytest.mark.parametrize("command", ["abort", "recover"])
def test_help_says_when_force_live_is_safe(command: str) -> None:
    result = CliRunner().invoke(cli.app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.replace("│", " ").split())  # rich draws boxes
    assert "--force-live" in text
    assert "known to be dead" in text and "a live committer is fenced" in text


def test_abort_is_refused_while_a_committer_holds_its_lease_and_names_force_live(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    ledger.acquire_commit_lease("orders", cp.checkpoint_id, owner=COMMITTER, ttl_s=300)
    code, err = _run("abort", "mod:PIPE", str(cp.checkpoint_id), "--reason", "staging lost")
    assert code == 1, err
    assert f"checkpoint {cp.checkpoint_id} is being committed by {COMMITTER!r} until " in err
    assert "wait, or stop it first" in err
    assert "known to be dead" in err and "--force-live" in err
    assert broker.calls == []  # nothing fenced
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.PREPARED


def test_abort_with_force_live_takes_the_lease_fences_and_aborts(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    ledger.acquire_commit_lease("orders", cp.checkpoint_id, owner=COMMITTER, ttl_s=300)
    code, err = _run(
        "abort", "mod:PIPE", str(cp.checkpoint_id), "--reason", "committer host gone", "--force-live"
    )
    assert code == 0, err
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.ABORTED
    assert [tid for tid, call in broker.calls if call == "init_transactions"] == [
        "eo.orders.0",
        "eo.orders.1",
        "eo.orders.0",  # the abort marks
        "eo.orders.1",
    ]


def test_recover_is_refused_while_a_committer_holds_its_lease_and_names_force_live(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    ledger.acquire_commit_lease("orders", cp.checkpoint_id, owner=COMMITTER, ttl_s=300)
    code, err = _run("recover", "mod:PIPE", "--wait", "0")
    assert code == 1, err
    assert f"checkpoint {cp.checkpoint_id} is being committed by {COMMITTER!r} until " in err
    assert "known to be dead" in err and "--force-live" in err
    assert broker.count("init_transactions") == 0
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.PREPARED


def test_recover_with_force_live_commits_the_prepared_checkpoint(
    pipeline: Pipeline, ledger: Ledger, broker: FakeBroker
) -> None:
    cp = prepared_checkpoint(ledger, pipeline, OUTPUT, sink_partitions=2)
    ledger.acquire_commit_lease("orders", cp.checkpoint_id, owner=COMMITTER, ttl_s=300)
    code, err = _run("recover", "mod:PIPE", "--wait", "0", "--force-live")
    assert code == 0, err
    assert ledger.get("orders", cp.checkpoint_id).state is CheckpointState.COMMITTED
    assert broker.values(OUT) == [b"a0", b"b0", b"b1"]
