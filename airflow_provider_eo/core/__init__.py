"""The exactly-once protocol: plan, prepare, commit, abort, recover (see DESIGN.md §2)."""
