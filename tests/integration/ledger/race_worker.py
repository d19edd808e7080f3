"""A worker process for the race tests: reads one JSON command per line from stdin, runs it
against the ledger, and writes one JSON result per line. Prints ``ready`` first."""

from __future__ import annotations

import json
import sys

from airflow_provider_eo.ledger import CheckpointConflict, InvariantViolation, Ledger, RangeSpec
from airflow_provider_eo.ledger.errors import CommitLeaseHeld


def main() -> None:
    ledger = Ledger(sys.argv[1], create=False)
    name = sys.argv[2]
    ledger.get_pipeline("race")  # connect before the race starts
    print("ready", flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if cmd["op"] == "prepare":
                ledger.mark_prepared(
                    "race",
                    cmd["cp"],
                    attempt=name,
                    staging_location=name,
                    records=1,
                    bytes_=1,
                    shard_counts={0: 1},
                )
            elif cmd["op"] == "plan":
                ledger.plan("race", [RangeSpec(*r) for r in cmd["ranges"]])
            elif cmd["op"] == "lease":
                ledger.acquire_commit_lease("race", cmd["cp"], owner=name, ttl_s=60)
            result = {"ok": True}
        except (CheckpointConflict, InvariantViolation, CommitLeaseHeld) as exc:
            result = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        except Exception as exc:
            result = {"ok": False, "error": "unexpected:" + type(exc).__name__, "message": str(exc)}
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
