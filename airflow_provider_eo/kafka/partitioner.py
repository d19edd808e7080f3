"""Java-compatible sink partition assignment.

Keyed records go where the Java client's default partitioner puts them:
``toPositive(murmur2(key)) % partitions`` (librdkafka's default, ``consistent_random``, is a
different hash). The partition is chosen at prepare time and given explicitly at produce time.
"""

from __future__ import annotations

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as a signed 32-bit int (same value as the Java client)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length - (length % 4)
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rem = length % 4
    if rem == 3:
        h ^= data[end + 2] << 16
    if rem >= 2:
        h ^= data[end + 1] << 8
    if rem >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def java_partition(key: bytes, partitions: int) -> int:
    """The partition the Java producer's default partitioner picks for a non-null ``key``."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
