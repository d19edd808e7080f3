"""One-shot service of docker/docker-compose.yml: create the demo's topics and produce sample
events, so the example DAG's first plan finds its input (the broker has
auto.create.topics.enable=false on purpose: a missing topic is an error the pipeline reports).

Uses the same settings as the DAG (``EO_KAFKA_BOOTSTRAP``, ``EO_DEMO_SOURCE_TOPIC``,
``EO_DEMO_SINK_TOPIC``, see dags/eo_demo_pipelines.py). Idempotent: topics that exist are
kept, and the sample events are produced only while the source topic is empty, so
re-running ``docker compose up`` does not add duplicates of the sample.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    """Create both topics (3 partitions each), seed the source when it is empty."""
    from airflow_provider_eo.demo.sample import produce_sample
    from airflow_provider_eo.kafka.admin import ensure_topic, list_offsets

    bootstrap = os.environ.get("EO_KAFKA_BOOTSTRAP", "kafka:9092")
    source = os.environ.get("EO_DEMO_SOURCE_TOPIC", "eo-demo-events")
    sink = os.environ.get("EO_DEMO_SINK_TOPIC", "eo-demo-enriched")
    conf = {"bootstrap.servers": bootstrap}
    for topic in (source, sink):
        created = ensure_topic(conf, topic, partitions=3)
        print(f"topic {topic}: {'created' if created else 'exists'}", flush=True)
    ends = list_offsets(conf, [(source, p) for p in range(3)], spec="latest")
    if any(ends.values()):
        print(f"{source} already holds records ({sum(ends.values())} offsets): no sample produced")
        return 0
    committed, aborted = produce_sample(bootstrap, source)
    print(f"produced {committed} committed and {aborted} aborted sample events into {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
