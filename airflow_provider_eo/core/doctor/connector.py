"""The Spark Kafka connector: its version against the installed Spark's."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_provider_eo.core.doctor.report import Finding

_KAFKA_CONNECTOR = re.compile(
    r"spark-sql-kafka-0-10_(?P<scala>[0-9.]+)[:-](?P<version>\d+\.\d+\.\d+[^:,/]*?)(?:\.jar)?$"
)


def judge_connector(
    spark_conf: Mapping[str, str],
    spark_version: str,
    *,
    cached_jars: Sequence[str],
    exists: Any = os.path.exists,
) -> Finding:
    """The Spark Kafka connector: given in the pipeline's ``spark.jars.packages`` /
    ``spark.jars``, at the installed Spark version; else eo's local jar cache
    (``cached_jars``, what ``eo dev jars`` fetched), which ``get_spark`` uses when
    ``spark.jars`` is not set."""
    check = "spark-connector"
    given: list[tuple[str, str]] = []  # (where, coordinate or path)
    for key in ("spark.jars.packages", "spark.jars"):
        for item in (spark_conf.get(key) or "").split(","):
            item = item.strip()
            if "spark-sql-kafka-0-10" in item:
                given.append((key, item))
    for key, item in given:
        m = _KAFKA_CONNECTOR.search(item)
        if m is not None and m.group("version") != spark_version:
            return Finding(
                check,
                "fail",
                f"{key} gives {item!r}, but Spark is {spark_version}: the connector must match Spark exactly",
                f"use org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}",
            )
        if key == "spark.jars" and "://" not in item and not exists(item):
            return Finding(check, "fail", f"spark.jars names {item!r}, which does not exist", "fix the path")
    if given:
        return Finding(check, "ok", f"connector given in spark_conf: {', '.join(i for _k, i in given)}")
    if "spark.jars" in spark_conf:
        return Finding(
            check,
            "fail",
            "spark_conf sets spark.jars without spark-sql-kafka-0-10, so eo's connector jars are "
            "not added: the Kafka source would be missing",
            f"add org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version} to spark.jars.packages "
            "(or its jars to spark.jars)",
        )
    if cached_jars:
        return Finding(
            check,
            "ok",
            f"no connector in spark_conf; eo's cached spark-sql-kafka-0-10 {spark_version} jars "
            f"({len(cached_jars)} files) are added by get_spark",
        )
    return Finding(
        check,
        "warn",
        f"no connector in spark_conf and eo's jar cache has no spark-sql-kafka-0-10 {spark_version}: "
        "the first local prepare fetches it with Maven (needs Maven and Maven Central)",
        f"set spark_conf spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version} "
        "(clusters), or run `eo dev jars` once (local development)",
    )
