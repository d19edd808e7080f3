"""librdkafka's own log lines go through Python logging, never straight to stderr.

No broker is needed: the clients point at a free port on 127.0.0.1 (nothing listens), so
librdkafka logs ``FAIL`` (connection refused) lines, which used to be printed as
``%3|...|FAIL|...`` on stderr and flooded the CLI's, the demo's and the tests' output.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, logging, sys, time

    from airflow_provider_eo.errors import KafkaAdminError
    from airflow_provider_eo.kafka import admin
    from airflow_provider_eo.kafka.client_config import librdkafka_config
    from airflow_provider_eo.kafka.publisher import new_producer

    LIBRDKAFKA_LOGGER = "airflow_provider_eo.kafka.librdkafka"
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append([record.levelname, record.getMessage()])

    logging.getLogger(LIBRDKAFKA_LOGGER).addHandler(Keep())
    logging.getLogger(LIBRDKAFKA_LOGGER).setLevel(logging.DEBUG)
    config = librdkafka_config({"bootstrap.servers": sys.argv[1]})
    try:
        admin.partitions_of(config, ["t"], timeout_s=1.0)
    except KafkaAdminError:
        pass
    admin.group_consumer(config, "g")
    producer = new_producer(config, "tx-logging", 10_000)
    deadline = time.monotonic() + 20
    while not any("FAIL" in m for _, m in seen) and time.monotonic() < deadline:
        producer.poll(0.2)
        admin.admin_client(config)
        admin.group_consumer(config, "g")
    print(json.dumps(seen))
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_librdkafka_lines_reach_python_logging_not_stderr() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, f"127.0.0.1:{_free_port()}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    leaked = [line for line in proc.stderr.splitlines() if line.startswith("%")]
    assert not leaked, f"librdkafka printed to stderr: {leaked[:3]}"
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    fails = [(level, msg) for level, msg in seen if "FAIL" in msg and "Connection refused" in msg]
    assert fails, seen
    # Connection failures librdkafka retries by itself are warnings here, not errors.
    assert {level for level, _ in fails} == {"WARNING"}, fails
