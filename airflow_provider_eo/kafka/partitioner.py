"""Java-compatible sink partition assignment.

Keyed records go where the Java client's default partitioner puts them:
``toPositive(murmur2(key)) % partitions`` (librdkafka's default, ``consistent_random``, is a
different hash). The partition is chosen at prepare time and given explicitly at produce time.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

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


# Keys longer than this many 4-byte blocks are hashed one by one: the vectorized loop runs
# once per block of the longest key, so a single huge key would make every batch slow.
_VECTOR_MAX_BLOCKS = 64


def java_partitions(keys: pa.Array, partitions: int) -> pa.Array:
    """:func:`java_partition` of every key of an Arrow binary/string array, vectorized with
    numpy (int32; ``-1`` where the key is null).

    Each loop step hashes one 4-byte block of every key that is that long, so the work is
    the keys' total length, not a Python call per key.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not pa.types.is_large_binary(keys.type):
        keys = keys.cast(pa.large_binary())  # int64 offsets, whatever came in
    n = len(keys)
    if n == 0:
        return pa.array([], pa.int32())
    _validity, offsets_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[keys.offset : keys.offset + n + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1]
    lengths = offsets[1:] - starts
    m = np.uint32(_M)
    h = np.uint32(_SEED) ^ lengths.astype(np.uint32)
    blocks = lengths // 4
    long_keys = np.nonzero(blocks > _VECTOR_MAX_BLOCKS)[0]
    if len(long_keys):
        blocks = blocks.copy()
        blocks[long_keys] = 0
    with np.errstate(over="ignore"):
        for b in range(int(blocks.max(initial=0))):
            sel = np.nonzero(blocks > b)[0]
            at = starts[sel] + 4 * b
            k = (
                data[at].astype(np.uint32)
                | (data[at + 1].astype(np.uint32) << np.uint32(8))
                | (data[at + 2].astype(np.uint32) << np.uint32(16))
                | (data[at + 3].astype(np.uint32) << np.uint32(24))
            )
            k *= m
            k ^= k >> np.uint32(24)
            k *= m
            h[sel] = (h[sel] * m) ^ k
        rem = lengths % 4
        tail = starts + (lengths - rem)
        for r, shift in ((3, 16), (2, 8)):
            sel = np.nonzero(rem >= r)[0]
            h[sel] ^= data[tail[sel] + r - 1].astype(np.uint32) << np.uint32(shift)
        sel = np.nonzero(rem >= 1)[0]
        h[sel] = (h[sel] ^ data[tail[sel]].astype(np.uint32)) * m
        h ^= h >> np.uint32(13)
        h *= m
        h ^= h >> np.uint32(15)
    out = ((h & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int32)
    for i in long_keys:
        out[i] = java_partition(data[starts[i] : starts[i] + lengths[i]].tobytes(), partitions)
    if keys.null_count:
        out[np.asarray(keys.is_null())] = -1
    return pa.array(out, pa.int32())
