"""The ``shuffle_samples`` stage: a sample shuffle buffer that a checkpoint can hold."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import IterDataPipe
from typing_extensions import override

from shardpipes._core.samples import Sample
from shardpipes._core.shuffle import ShuffleBuffer, buffer_seed_of
from shardpipes._core.stage import checked_int, loaded_state
from shardpipes.pipes._stage import Pipe, functional_form

__all__ = ["SampleShuffler"]


@functional_form("shuffle_samples")
class SampleShuffler(Pipe):
    """Shuffle samples through a buffer, resumably (functional name: ``shuffle_samples``).

    What torch's ``shuffle(buffer_size=...)`` does — each new sample takes the place of a
    random buffered one, which is yielded — on samples as read (after ``open_tar``, or a
    ``mix``, ``limit_samples``… of them: stages that pass the samples on as they are), with
    two differences:

    * a checkpoint holds the buffer: its state saves the samples as byte ranges
      ``(shard, start, end)`` with the generator's state, a few bytes per sample, and
      resuming re-reads just those samples. torch's ``shuffle`` holds samples a checkpoint
      cannot describe, so a pipeline with it cannot resume;
    * with a seed (this stage's, or the ``split_shards`` stage's) the order is a function of
      ``(seed, epoch, pass, worker)``: the same on every run. Without, the DataLoader's seed
      decides, as for torch's ``shuffle``.

    ``DataLoader(pipe, shuffle=False)`` turns it off (``set_shuffle``).

    Args:
        source_datapipe: Samples as read (before ``decode``: the buffer holds their bytes,
            and a restored one reads them again by range).
        buffer_size: Samples held per worker; below 2, no shuffling.
        seed: A fixed seed; by default the ``split_shards`` stage's, else the DataLoader's.

    Example:
        >>> import shardpipes as sp
        >>> pipe = (sp.list_shards("data/train-{000..009}.tar").split_shards(seed=1)
        ...           .open_tar().shuffle_samples(buffer_size=1000).decode("torch"))
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[Sample],
        buffer_size: int = 1000,
        *,
        seed: int | None = None,
    ) -> None:
        checked_int(buffer_size, "buffer_size", 0)
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            msg = f"seed must be an int or None (got {seed!r})"
            raise TypeError(msg)
        super().__init__()
        self.source_datapipe = source_datapipe
        self.buffer_size, self.seed = buffer_size, seed
        self.enabled = True  # DataLoader(shuffle=False) turns it off
        self._shared: int | None = None  # the DataLoader's seed (set_seed)
        self._buffer: ShuffleBuffer | None = None  # the current epoch's
        self._loaded: Mapping[str, Any] | None = None  # the buffer the next epoch starts with

    def set_seed(self, seed: int) -> SampleShuffler:
        """Seed the buffer (the DataLoader calls this); a fixed seed rules."""
        self._shared = seed
        return self

    def set_shuffle(self, shuffle: bool = True) -> SampleShuffler:
        """Turn the buffer on or off (``DataLoader(pipe, shuffle=...)`` calls this)."""
        self.enabled = bool(shuffle)
        return self

    @property
    def seeded(self) -> bool:
        """A buffer without a fixed seed (its own, or the split's) takes the DataLoader's."""
        unfixed = self._fixed_seed() is None
        return not (self.enabled and self.buffer_size >= 2 and unfixed) and super().seeded

    def _fixed_seed(self) -> int | None:
        """This stage's seed, else the ``split_shards`` stage's; ``None`` if neither."""
        return self.seed if self.seed is not None else self.sources()[0].split_seed()

    def state(self) -> dict[str, Any]:
        """The source's state, and the buffer as references (see ``ShuffleBuffer``)."""
        own = self._buffer.state() if self._buffer is not None else self._loaded
        return {"source": self.sources()[0].state(), "buffer": own, "shared": self._shared}

    @override
    def reset(self, state: Mapping[str, Any] | None = None) -> None:
        state = loaded_state(state, "shuffle_samples", "buffer")
        self._fresh, self._buffer = True, None
        self._loaded = None if state is None else state["buffer"]
        if state is not None and state.get("shared") is not None:
            self._shared = state["shared"]
        self.sources()[0].reset(None if state is None else state["source"])

    @override
    def next_pass(self) -> None:
        self._buffer = self._loaded = None
        super().next_pass()

    def _start(self, fetch: bool) -> ShuffleBuffer:
        source = self.sources()[0]
        size = self.buffer_size if self.enabled else 0
        buffer = ShuffleBuffer(size, self._seed(source))
        loaded, self._loaded = self._loaded, None
        if loaded is not None:
            buffer.restore(loaded, source.fetch if fetch else None)
        self._buffer = buffer
        return buffer

    def _seed(self, source: Any) -> int:
        """A function of ``(seed, epoch, pass, global worker)``; random without a seed."""
        base = self._fixed_seed()
        if base is None:
            base = self._shared
        if base is None:  # no DataLoader: a fresh seed from torch's generator, as its shuffle
            return int(torch.empty((), dtype=torch.int64).random_().item())
        return buffer_seed_of(base, source.epoch, source.placement()[1], source.pass_)

    def _iterate(self) -> Iterator[Any]:
        return self._start(fetch=True).shuffled(iter(self.source_datapipe))

    def _references(self) -> Iterator[Any]:
        return self._start(fetch=False).shuffled(self.sources()[0].references())
