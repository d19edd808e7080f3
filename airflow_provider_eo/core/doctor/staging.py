"""The staging location: writable here, and shared with the Spark executors."""

from __future__ import annotations

from airflow_provider_eo.core.doctor.report import Finding


def judge_staging(staging_dir: str, error: str | None) -> Finding:
    """Whether a probe file could be written and removed in the staging dir."""
    if error is None:
        return Finding("staging", "ok", f"{staging_dir} is writable")
    return Finding(
        "staging",
        "fail",
        f"cannot write to staging_dir {staging_dir}: {error}",
        "fix the permissions / credentials, or set Pipeline(staging_dir=...) to a place the "
        "prepare job (Spark executors) and the commit can both reach",
    )


def judge_staging_shared(
    location: str, written: int | None, seen: int, host: str, error: str | None
) -> Finding:
    """Whether the rows Spark's executors wrote under the staging location are all visible
    from this process (``written`` and ``seen`` from the staging probe)."""
    check = "staging shared"
    if error is not None:
        return Finding(
            check,
            "fail",
            f"Spark could not write a probe under {location}: {error}",
            "check spark_conf (master, resources) and that the executors can write there",
        )
    if written == seen:
        return Finding(
            check,
            "ok",
            f"the {written} rows Spark's executors wrote under {location} are visible here ({host})",
        )
    return Finding(
        check,
        "fail",
        f"Spark's executors wrote {written} rows under {location} but this process ({host}) sees "
        f"{seen}: a prepare would be refused (StagingError) and the commit could not read it",
        "staging_dir must be one location shared by the Spark driver, every executor and the "
        "committer (a shared filesystem mounted at the same path everywhere, or hdfs://, s3a://, "
        "gs://, abfss://); a local folder works only with a local master. Run `eo doctor` where "
        "the commit runs",
    )
