"""Triggers of the exactly-once provider (they only read)."""
