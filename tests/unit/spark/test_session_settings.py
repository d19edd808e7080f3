"""Which Spark settings a new session gets (spark/session.py): eo's local defaults only when
it starts Spark itself on a local master; under spark-submit the submit's settings win."""

from __future__ import annotations

import pytest

from airflow_provider_eo.spark import session


def test_local_master_gets_the_small_local_defaults_and_the_pipeline_wins() -> None:
    got = session.session_settings(
        {"spark.master": "local[2]", "spark.sql.shuffle.partitions": "9"}, under_submit=False
    )
    assert got["spark.sql.shuffle.partitions"] == "9"
    assert got["spark.ui.enabled"] == "false" and got["spark.driver.host"] == "127.0.0.1"
    assert got["spark.sql.session.timeZone"] == "UTC"


def test_a_cluster_master_started_by_eo_keeps_the_users_ui_memory_and_addresses() -> None:
    got = session.session_settings({"spark.master": "spark://m:7077"}, under_submit=False)
    assert got == {"spark.master": "spark://m:7077", "spark.sql.session.timeZone": "UTC"}


def test_under_spark_submit_its_settings_win(monkeypatch: pytest.MonkeyPatch) -> None:
    submitted = {
        "spark.master": "yarn",
        "spark.sql.shuffle.partitions": "37",
        "spark.app.name": "eo-prepare",
    }
    monkeypatch.setattr(session, "_submitted_conf", lambda: dict(submitted))
    got = session.session_settings(
        {"spark.sql.shuffle.partitions": "4", "spark.master": "local[2]", "spark.executor.cores": "3"},
        under_submit=True,
    )
    # The pipeline fills in what the submit did not set; no local default (UI, memory, 4).
    assert got == {"spark.executor.cores": "3", "spark.sql.session.timeZone": "UTC"}
    submitted["spark.sql.session.timeZone"] = "Europe/Paris"
    assert session.session_settings(None, under_submit=True) == {}


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[*]", True),
        ("local-cluster[2,1,1024]", True),
        ("spark://h:7077", False),
        ("yarn", False),
    ],
)
def test_is_local_master(master: str, local: bool) -> None:
    assert session.is_local_master(master) is local
