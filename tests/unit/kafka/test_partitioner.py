"""murmur2 against vectors computed with the Java client's Utils.murmur2 (kafka-clients 4.1.1)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from airflow_provider_eo.kafka.partitioner import java_partition, java_partitions, murmur2

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


def test_vectorized_matches_java_vectors() -> None:
    keys = pa.array([k.encode() for k, *_ in JAVA_VECTORS] + [None], pa.binary())
    assert java_partitions(keys, 3).to_pylist() == [p3 for *_, p3, _ in JAVA_VECTORS] + [-1]
    assert java_partitions(keys, 12).to_pylist() == [p12 for *_, p12 in JAVA_VECTORS] + [-1]


@pytest.mark.parametrize("arrow_type", [pa.binary(), pa.large_binary()])
def test_vectorized_matches_scalar(arrow_type: pa.DataType) -> None:
    """Every key length mod 4, keys past the vectorized block limit, nulls, a sliced array."""
    rng = random.Random(7)
    lengths = [0, 1, 2, 3, 4, 5, 7, 8, 11, 16, 33, 255, 256, 257, 300, 1000]
    keys = [
        bytes(rng.getrandbits(8) for _ in range(rng.choice(lengths))) if rng.random() > 0.1 else None
        for _ in range(2000)
    ]
    array = pa.array(keys, arrow_type)
    for partitions in (1, 7, 100):
        expected = [java_partition(k, partitions) if k is not None else -1 for k in keys]
        assert java_partitions(array, partitions).to_pylist() == expected
        assert java_partitions(array.slice(123, 700), partitions).to_pylist() == expected[123:823]
    assert java_partitions(pa.array([], arrow_type), 3).to_pylist() == []
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        java_partitions(array, 0)
