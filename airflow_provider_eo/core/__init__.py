"""The exactly-once protocol: plan, prepare, commit, abort, recover (see docs/design.md §2)."""
