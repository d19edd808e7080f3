"""The tests' Spark drivers map the class-data-sharing archive (``tests/eo_jvm_archive.py``):
an archive that no longer fits their class path is ignored silently and every driver JVM
takes twice the CPU to start, so a change to that class path (a conf folder, a jar) must
fail here instead."""

from __future__ import annotations

import os
import subprocess

import pytest
from eo_jvm_archive import make_archive, spark_home_bin

pytestmark = [pytest.mark.spark]


def test_a_driver_jvm_with_the_tests_settings_maps_the_archive() -> None:
    # scripts/test.sh makes it before the run (then this returns at once); made here otherwise.
    archive = make_archive()
    assert archive is not None and archive.is_file(), "the class archive could not be made"
    from eo_jvm_archive import spark_submit_opts

    opts = spark_submit_opts()
    assert str(archive) in opts, opts
    # -Xshare:on: a JVM that cannot map the archive exits with an error instead of going on.
    done = subprocess.run(
        [str(spark_home_bin() / "spark-submit"), "--version"],
        env={**os.environ, "SPARK_SUBMIT_OPTS": f"{opts} -Xshare:on -Xlog:cds=error"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert "Unable to use shared archive" not in done.stdout + done.stderr
