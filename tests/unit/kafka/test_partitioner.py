"""murmur2 against vectors computed with the Java client's Utils.murmur2 (kafka-clients 4.1.1)."""

from __future__ import annotations

import pytest

from airflow_provider_eo.kafka.partitioner import java_partition, murmur2

# key, Utils.murmur2(key.getBytes(UTF_8)), partition of 3, partition of 12
JAVA_VECTORS = [
    ("", 275646681, 0, 9),
    ("a", -1563381124, 1, 4),
    ("ab", 316155434, 2, 2),
    ("abc", 479470107, 0, 3),
    ("21", -973932308, 0, 0),
    ("foobar", -790332482, 0, 6),
    ("a-little-bit-long-string", -985981536, 2, 8),
    ("a-little-bit-longer-string", -1486304829, 2, 11),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971, 2, 5),
    ("user-42", 1459644460, 1, 4),
    ("ключ", 2122343024, 2, 8),
    ("order-000123", 292724393, 2, 5),
]


@pytest.mark.parametrize(("key", "expected", "p3", "p12"), JAVA_VECTORS)
def test_matches_java(key: str, expected: int, p3: int, p12: int) -> None:
    data = key.encode()
    assert murmur2(data) == expected
    assert java_partition(data, 3) == p3
    assert java_partition(data, 12) == p12


def test_binary_key() -> None:
    assert murmur2(bytes([0xFF, 0x00, 0x80, 0x7F, 0xFE])) == 1118688894


def test_partitions_must_be_positive() -> None:
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        java_partition(b"k", 0)
