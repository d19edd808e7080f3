"""Which sink partitioner a session gets: the JVM function when eo's jar loads, else Arrow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_provider_eo.spark import udfs
from airflow_provider_eo.stack import javac


class _Udf:
    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.registered: list[tuple[str, str, str]] = []

    def registerJavaFunction(self, name: str, cls: str, returns: str) -> None:
        if self.fails:
            raise RuntimeError(f"class {cls} not found")
        self.registered.append((name, cls, returns))


class _Spark:
    def __init__(self, fails: bool) -> None:
        self.udf = _Udf(fails)


def test_jvm_function_when_the_class_loads() -> None:
    spark = _Spark(fails=False)
    assert udfs.register_java_partitioner(spark)
    assert spark.udf.registered == [("eo_kafka_partition", "eo.spark.KafkaPartition", "int")]


def test_arrow_udf_when_the_jar_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not udfs.register_java_partitioner(_Spark(fails=True))
    monkeypatch.setattr(udfs, "murmur2_partitioner", lambda n: ("arrow", n))
    assert udfs.kafka_partitioner(_Spark(fails=True), 6) == ("arrow", 6)


def test_no_jdk_means_no_jar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setenv("EO_HOME", str(tmp_path))
    monkeypatch.setattr(javac.shutil, "which", lambda tool: None)
    assert javac.udf_jar() is None
    assert "eo: no JDK (javac and jar on PATH): sink partitions are computed by a Python UDF" in (
        capsys.readouterr().err
    )
