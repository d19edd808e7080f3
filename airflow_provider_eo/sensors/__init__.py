"""Sensors of the exactly-once provider."""
