"""A shuffle buffer that a checkpoint can hold: its samples as references, not bytes.

:class:`ShuffleBuffer` shuffles as torch's ``Shuffler`` does — each new item takes the
place of a random buffered one, which is yielded — and its :meth:`~ShuffleBuffer.state`
is the buffered samples as ``[shard, start, end, source]`` references with its
generator's state: a few bytes per sample (a full 5,000-sample buffer is about 120 KB of
JSON). Restoring takes the samples back from those references (``fetch``): one ranged
read each, nothing else read again.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from shardpipes._core.reading import reference


def pack(samples: Iterable[Any], holder: str) -> dict[str, Any]:
    """Samples as references in plain data: ``[shard, start, end, source]`` each.

    Raises:
        ValueError: An item is not a sample as read (a function of the user's made it), so
            no byte range describes it; names ``holder``, the stage that holds it.
    """
    shards: dict[str, int] = {}
    refs = []
    for sample in samples:
        end = getattr(sample, "end", None)
        if end is None:
            msg = (
                f"{holder} holds a {type(sample).__name__} that is not a sample as read from "
                f"a shard (a map of yours made it), which a checkpoint cannot describe: put "
                f"{holder} before the map (after open_tar, decode, rename_fields or map_fields)"
            )
            raise ValueError(msg)
        shard = shards.setdefault(sample["__url__"], len(shards))
        refs.append([shard, sample.offset, end, sample.get("__source__")])
    return {"shards": list(shards), "refs": refs}


def unpack(packed: Mapping[str, Any]) -> list[Any]:
    """The sample references :func:`pack` made (``{"shards", "refs"}``)."""
    urls = packed["shards"]
    return [reference(urls[s], start, end, tag) for s, start, end, tag in packed["refs"]]


def buffer_seed_of(base: int, epoch: int, worker: int, pass_: int = 0) -> int:
    """The seed of global worker ``worker``'s shuffle buffer in ``epoch`` (and pass)."""
    key = f"buffer:{base}:{epoch}:{worker}" + (f":{pass_}" if pass_ else "")
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little")


class ShuffleBuffer:
    """The buffer of one epoch, with its position.

    Args:
        size: Samples held; below 2, items pass in order.
        seed: The generator's seed.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size = size if size >= 2 else 0
        self.rng = random.Random(seed)
        self.items: list[Any] = []
        self.draining = False  # the source ran out: the buffer empties

    def shuffled(self, source: Iterable[Any]) -> Iterator[Any]:
        """``source``'s items, shuffled through the buffer."""
        items, rng, size = self.items, self.rng, self.size
        if not size:
            yield from source
            return
        if not self.draining:
            for item in source:
                if len(items) < size:
                    items.append(item)
                    continue
                i = rng.randrange(size)
                items[i], item = item, items[i]
                yield item
            rng.shuffle(items)
            self.draining = True
        else:  # restored while draining: the source, at its end, still checks the state
            items.extend(source)
        while items:
            yield items.pop()

    def state(self) -> dict[str, Any]:
        """The buffer as references, and the generator's state."""
        packed = pack(self.items, "shuffle_samples")
        version, internal, gauss = self.rng.getstate()
        return {
            "buffer": packed["refs"],
            "shards": packed["shards"],
            "rng": [version, list(internal), gauss],
            "draining": self.draining,
        }

    def restore(
        self, state: Mapping[str, Any], fetch: Callable[[list[Any]], Iterable[Any]] | None
    ) -> None:
        """Go back to a :meth:`state`: its samples by ``fetch`` of their references.

        ``fetch=None`` keeps the references themselves (a replay on references).
        """
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.draining = bool(state["draining"])
        refs = unpack({"shards": state["shards"], "refs": state["buffer"]})
        self.items = refs if fetch is None else list(fetch(refs))
