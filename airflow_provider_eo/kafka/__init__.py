"""Kafka side: offsets and watermarks, admin, the transactional publisher, markers, the auditor."""
