"""The ``eo.prov`` header every published record carries, in one module: its text and
compact forms, one record at a time (the read side: the audit, the sink guard, the read-back)
and in bulk from a staged Arrow batch (the commit's produce loop).

numpy and pyarrow are imported by the bulk encoders when they run, so importing this module
(through :mod:`airflow_provider_eo.names`) stays light for a DAG file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

# The provenance header on every published record (read by the auditor, the sink guard and
# the read-back). One header, not three: each header costs librdkafka a separate allocation
# and copy per record. What it says, in the text form earlier versions wrote (three
# space-separated fields):
#   "<pipeline>:<checkpoint_id>:<identity8> <sink_partition>:<index> <topic>:<partition>:<offset>"
# (identity8 is the first 8 characters of the pipeline's ledger identity, so the output
# itself proves which ledger published a checkpoint when its marker expired; records
# published before it existed have "<pipeline>:<checkpoint_id>". The index is the record's
# position in the checkpoint's staged output of that sink partition, unique per checkpoint;
# the source position is "-" when the transform dropped provenance). Pipeline and topic
# names cannot contain spaces; pipeline names cannot contain ':'.
#
# eo writes the same fields in a compact binary form (:func:`compact_provenance_prefix`):
#   0x01 | varint len(pipeline) | pipeline | varint len(identity8) | identity8
#        | varint checkpoint_id | varint sink_partition | varint index
#        [ | varint source partition | varint source offset | source topic ]
# (unsigned LEB128 varints; no source part when the transform dropped provenance; the
# topic takes the rest of the value). The text form always starts with a pipeline name's
# first character (a letter or digit), never 0x01, so a reader tells the two apart by the
# first byte; :func:`parse_provenance` reads both and returns the text form's fields, so
# records of either form count alike (sinks hold both).
HEADER_PROVENANCE = "eo.prov"
PROVENANCE_IDENTITY_CHARS = 8
PROVENANCE_COMPACT = 0x01
"""First byte of the compact ``eo.prov`` form (never the first byte of the text form)."""


def provenance_checkpoint_field(pipeline_name: str, checkpoint_id: int, identity: str) -> str:
    """The first field of the ``eo.prov`` header: ``<pipeline>:<checkpoint_id>:<identity8>``."""
    return f"{pipeline_name}:{checkpoint_id}:{identity[:PROVENANCE_IDENTITY_CHARS]}"


def parse_checkpoint_field(field: bytes, pipeline_name: str) -> tuple[int, str | None] | None:
    """(checkpoint id, identity8 or ``None`` for the old two-part form) of an ``eo.prov``
    first field of pipeline ``pipeline_name``; ``None`` when it names another pipeline or is
    not one of ours."""
    prefix = f"{pipeline_name}:".encode()
    if not field.startswith(prefix):
        return None
    rest = field[len(prefix) :].split(b":")
    if len(rest) > 2 or not rest[0].isdigit():
        return None
    return int(rest[0]), (rest[1].decode(errors="replace") if len(rest) == 2 else None)


def varint(value: int) -> bytes:
    """Unsigned LEB128 of a non-negative int (the compact ``eo.prov`` form's numbers)."""
    if value < 0:
        raise ValueError(f"a provenance number cannot be negative: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def compact_provenance_prefix(checkpoint_field: bytes, sink_partition: int) -> bytes:
    """The part of the compact ``eo.prov`` value shared by every record a checkpoint
    publishes to one sink partition, from the text first field
    (``<pipeline>:<checkpoint_id>[:<identity8>]``): marker, pipeline, identity8,
    checkpoint id and sink partition. Each record adds its index and source position."""
    parts = checkpoint_field.split(b":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].isdigit():
        raise ValueError(
            f"provenance checkpoint field {checkpoint_field!r} is not "
            "<pipeline>:<checkpoint_id>[:<identity8>]"
        )
    pipeline, identity = parts[0], parts[2] if len(parts) == 3 else b""
    return b"".join(
        (
            bytes((PROVENANCE_COMPACT,)),
            varint(len(pipeline)),
            pipeline,
            varint(len(identity)),
            identity,
            varint(int(parts[1])),
            varint(sink_partition),
        )
    )


def compact_provenance(
    checkpoint_field: bytes, sink_partition: int, index: int, source: tuple[str, int, int] | None
) -> bytes:
    """One record's compact ``eo.prov`` value (the commit builds them in bulk, in Arrow)."""
    value = compact_provenance_prefix(checkpoint_field, sink_partition) + varint(index)
    if source is None:
        return value
    topic, partition, offset = source
    return value + varint(partition) + varint(offset) + topic.encode()


def _read_varint(value: bytes, pos: int) -> tuple[int, int]:
    """(number, position after it) of the unsigned LEB128 at ``value[pos]``."""
    byte = value[pos]  # IndexError when the value ends inside the number
    if byte < 0x80:
        return byte, pos + 1
    result = shift = 0
    while shift < 64:
        byte = value[pos]  # IndexError when the value ends inside the number
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise ValueError("varint longer than 64 bits")


def _read_head(head: bytes) -> tuple[bytes, bytes] | None:
    """(first text field, ``b"<sink_partition>:"``) of a compact value's head: everything up
    to and including the sink partition; None when malformed."""
    try:
        size, pos = _read_varint(head, 1)
        pipeline, pos = head[pos : pos + size], pos + size
        size, pos = _read_varint(head, pos)
        identity, pos = head[pos : pos + size], pos + size
        if pos > len(head):  # a length past the end of the value
            return None
        checkpoint_id, pos = _read_varint(head, pos)
        sink_partition, pos = _read_varint(head, pos)
    except (IndexError, ValueError):
        return None
    if pos != len(head) or not pipeline or b":" in pipeline or b" " in pipeline:
        return None
    if b":" in identity or b" " in identity:
        return None
    first = (
        b"%s:%d:%s" % (pipeline, checkpoint_id, identity)
        if identity
        else b"%s:%d" % (pipeline, checkpoint_id)
    )
    return first, b"%d:" % sink_partition


_HEADS: dict[bytes, tuple[bytes, bytes] | None] = {}
"""Read heads of compact values (a checkpoint's records in one sink partition share one)."""
_UNREAD: tuple[bytes, bytes] = (b"", b"")


def _read_compact(value: bytes) -> tuple[bytes, bytes, bytes] | None:
    end = len(value)
    try:
        # where the head ends: two lengths with their bytes, then two varints
        size, pos = _read_varint(value, 1)
        size, pos = _read_varint(value, pos + size)
        pos += size
        for _ in range(2):
            while value[pos] >= 0x80:
                pos += 1
            pos += 1
        head = value[:pos]
        known = _HEADS.get(head, _UNREAD)  # one lookup: safe while another thread clears
        if known is _UNREAD:
            if len(_HEADS) >= 4096:
                _HEADS.clear()
            known = _HEADS[head] = _read_head(head)
        if known is None:
            return None
        index, pos = _read_varint(value, pos)
        if pos == end:
            return known[0], known[1] + b"%d" % index, b"-"
        partition, pos = _read_varint(value, pos)
        offset, pos = _read_varint(value, pos)
    except (IndexError, ValueError):
        return None
    topic = value[pos:]
    if not topic or b" " in topic:
        return None
    return known[0], known[1] + b"%d" % index, b"%s:%d:%d" % (topic, partition, offset)


def parse_provenance(value: bytes) -> tuple[bytes, bytes, bytes] | None:
    """Split an ``eo.prov`` header value, text or compact form, into (``pipeline:checkpoint``,
    ``sink_partition:index``, ``topic:partition:offset`` or ``-``), in the text form's
    spelling whichever form it was written in; None when it is not one of ours."""
    if value[:1] == b"\x01":
        return _read_compact(value)
    parts = value.split(b" ")
    if len(parts) != 3:
        return None
    return parts[0], parts[1], parts[2]


# -- in bulk, from a staged Arrow batch ----------------------------------------------------


def _string(text: str) -> pa.Scalar:
    """A string scalar built from buffers: ``pa.scalar(str)`` (also what compute functions do
    with a Python ``str`` argument) imports pandas, ~0.3 s of every fresh commit process."""
    import numpy as np
    import pyarrow as pa

    data = text.encode()
    offsets = np.array([0, len(data)], dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])[0]


def provenance_values(batch: pa.RecordBatch, prefix: str, first_index: int) -> pa.Array:
    """The ``eo.prov`` header value of every row of a staged batch in the text form, built in
    Arrow (no Python string formatting per record): ``prefix`` + index + " " + source
    position. eo writes the compact form (:func:`compact_provenance_values`); readers accept
    both.

    No Python object reaches pyarrow's converters here (``pa.array``/``pa.scalar`` on Python
    values import pandas on first use): arrays and scalars are built from buffers.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    positions = np.arange(first_index, first_index + n, dtype=np.int64)
    index = pc.cast(pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(positions)]), pa.string())
    src = pc.binary_join_element_wise(
        batch.column("src_topic"),
        pc.cast(batch.column("src_partition"), pa.string()),
        pc.cast(batch.column("src_offset"), pa.string()),
        _string(":"),
    )
    src = pc.fill_null(src, _string("-"))  # the transform dropped provenance
    joined = pc.binary_join_element_wise(_string(prefix), index, _string(" "), src, _string(""))
    return pc.cast(joined, pa.binary())


def _varints(numbers: np.ndarray) -> pa.Array:
    """Unsigned LEB128 of each int64 (``varint``), vectorized: a binary array built
    from buffers, one pass per byte of the longest number."""
    import numpy as np
    import pyarrow as pa

    n = len(numbers)
    unsigned = numbers.astype(np.uint64, copy=False)
    lengths = np.ones(n, dtype=np.int32)
    rest = unsigned >> np.uint64(7)
    while rest.any():
        lengths += rest != 0
        rest >>= np.uint64(7)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = np.empty(int(offsets[-1]), dtype=np.uint8)
    starts = offsets[:-1]
    rest = unsigned.copy()
    for k in range(int(lengths.max()) if n else 0):
        at = lengths > k
        more = (lengths - 1 > k).astype(np.uint8) << np.uint8(7)  # another byte follows
        group = (rest & np.uint64(0x7F)).astype(np.uint8) | more
        data[starts[at] + k] = group[at]
        rest >>= np.uint64(7)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _binary(data: bytes) -> pa.Scalar:
    import numpy as np
    import pyarrow as pa

    offsets = np.array([0, len(data)], dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])[0]


def _numbers(column: pa.Array) -> np.ndarray:
    """An integer column's values as int64 straight from its buffer (a null's slot holds
    anything: its row is dropped by the null check)."""
    import numpy as np

    width = column.type.bit_width // 8
    raw = np.frombuffer(column.buffers()[1], dtype=np.dtype(f"<i{width}"))
    return raw[column.offset : column.offset + len(column)].astype(np.int64)


def compact_provenance_values(batch: pa.RecordBatch, prefix: bytes, first_index: int) -> list[bytes]:
    """The compact ``eo.prov`` value (``compact_provenance``) of every row of a staged
    batch, built in Arrow and numpy: ``prefix`` (:func:`compact_provenance_prefix`) +
    varint index + (varint source partition + varint source offset + source topic, or
    nothing when the transform dropped provenance)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n = batch.num_rows
    index = _varints(np.arange(first_index, first_index + n, dtype=np.int64))
    src = pc.binary_join_element_wise(
        _varints(_numbers(batch.column("src_partition"))),
        _varints(_numbers(batch.column("src_offset"))),
        pc.cast(batch.column("src_topic"), pa.binary()),
        _binary(b""),
    )
    for name in ("src_partition", "src_offset"):  # a position with a null part names nothing
        column = batch.column(name)
        if column.null_count:
            src = pc.if_else(column.is_null(), pa.nulls(n, pa.binary()), src)
    src = pc.fill_null(src, _binary(b""))  # the transform dropped provenance
    values: list[bytes] = pc.binary_join_element_wise(_binary(prefix), index, src, _binary(b"")).to_pylist()
    return values
