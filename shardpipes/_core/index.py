"""Tar indexes: the byte range of every sample, so a worker can read only its own.

The idea of the tfrecord package's index files, for tar. The sidecar ``URL.idx`` is text:

.. code-block:: text

    shardpipes-index 1 <shard size in bytes> <number of samples>
    <start> <end>
    ...

one line per sample, ``start`` being the offset of its first member's first header and
``end`` the offset after its last member's padded data. Ranges are in order and do not
overlap; a range starts at a header boundary, so a reader can parse from there.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from shardpipes._core.samples import split_name
from shardpipes._core.tar import Member
from shardpipes.errors import ShardIndexError

_MAGIC = "shardpipes-index"
_VERSION = "1"


def sample_ranges(members: Iterable[Member]) -> list[tuple[int, int]]:
    """Compute each sample's ``(start, end)`` byte range from a shard's members.

    The members may have ``data=None`` (an index needs only headers). Samples are delimited
    by the same key-change rule as :func:`~shardpipes._core.samples.group_samples`.

    Example:
        >>> sample_ranges([Member("a.jpg", None, 0, 1024), Member("a.cls", None, 1024, 2048),
        ...                Member("b.jpg", None, 2048, 3072)])
        [(0, 2048), (2048, 3072)]
    """
    ranges: list[tuple[int, int]] = []
    key: str | None = None
    for member in members:
        split = split_name(member.name)
        if split is None:
            continue
        if split[0] != key:
            key = split[0]
            ranges.append((member.offset, member.end))
        else:
            ranges[-1] = (ranges[-1][0], member.end)
    return ranges


def dump_index(ranges: list[tuple[int, int]], shard_size: int) -> bytes:
    r"""Serialize an index.

    Example:
        >>> dump_index([(0, 2048), (2048, 3072)], 10240)
        b'shardpipes-index 1 10240 2\n0 2048\n2048 3072\n'
    """
    lines = [f"{_MAGIC} {_VERSION} {shard_size} {len(ranges)}"]
    lines.extend(f"{start} {end}" for start, end in ranges)
    return ("\n".join(lines) + "\n").encode("ascii")


def load_index(data: bytes, *, url: str, shard_size: int | None = None) -> list[tuple[int, int]]:
    """Parse an index, checking it against its shard's size when given.

    Args:
        data: The index file's bytes.
        url: The index URL, for errors.
        shard_size: The shard's current size; a mismatch means a stale index.

    Raises:
        ShardIndexError: If the index is malformed or stale.
    """
    try:
        head, *rows = data.decode("ascii").splitlines()
        magic, version, size_text, count_text = head.split()
        size, count = int(size_text), int(count_text)
        ranges = [(int(a), int(b)) for a, b in (row.split() for row in rows)]
    except ValueError as exc:
        msg = "malformed index"
        raise ShardIndexError(msg, url=url) from exc
    if magic != _MAGIC or version != _VERSION:
        msg = f"not a shardpipes index (header {head!r})"
        raise ShardIndexError(msg, url=url)
    ordered = all(a < b for a, b in ranges) and all(
        b <= a for (_, b), (a, _) in itertools.pairwise(ranges)
    )
    if count != len(ranges) or not ordered:
        msg = "malformed index: ranges out of order or count wrong"
        raise ShardIndexError(msg, url=url)
    if shard_size is not None and size != shard_size:
        msg = f"stale index: made for a shard of {size} bytes, the shard has {shard_size}"
        raise ShardIndexError(msg, url=url)
    return ranges
