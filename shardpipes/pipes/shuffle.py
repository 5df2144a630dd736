"""The ``shuffle_samples`` stage: a sample shuffle buffer that a checkpoint can hold."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import IterDataPipe

from shardpipes._core.samples import Sample
from shardpipes.pipes._epoch import ShuffleBuffer
from shardpipes.pipes._length import local_length
from shardpipes.pipes._stage import SampleStage, functional_form
from shardpipes.pipes.tar import TarOpener

__all__ = ["SampleShuffler"]


@functional_form("shuffle_samples")
class SampleShuffler(SampleStage):
    """Shuffle samples through a buffer, resumably (functional name: ``shuffle_samples``).

    What torch's ``shuffle(buffer_size=...)`` does — each new sample takes the place of a
    random buffered one, which is yielded — on the undecoded samples straight out of
    ``open_tar``, with two differences:

    * a checkpoint holds the buffer: ``state_dict()`` (and the plain ``StatefulDataLoader``)
      saves it as byte ranges ``(shard, start, end)`` with the generator's state, a few
      bytes per sample, and resuming re-reads just those samples. torch's ``shuffle``
      holds samples a checkpoint cannot describe, so a pipeline with it cannot resume;
    * with a seed (this stage's, or the ``split_shards`` stage's) the order is a function of
      ``(seed, epoch, worker)``: the same on every run. Without, the DataLoader's seed
      decides, as for torch's ``shuffle``.

    ``DataLoader(pipe, shuffle=False)`` turns it off (``set_shuffle``).

    Args:
        source_datapipe: An ``open_tar`` stage: this stage must follow it directly (the
            samples it buffers are the ones ``open_tar`` read, still as bytes).
        buffer_size: Samples held per worker; below 2, no shuffling.
        seed: A fixed seed; by default the ``split_shards`` stage's, else the DataLoader's.

    Raises:
        TypeError: If ``source_datapipe`` is not an ``open_tar`` stage.

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
        if not isinstance(source_datapipe, TarOpener):
            got = type(source_datapipe).__name__
            msg = (
                "shuffle_samples must follow open_tar directly: it buffers the samples as "
                f"read, which a checkpoint saves as byte ranges (got {got})"
            )
            raise TypeError(msg)
        super().__init__()
        self.source_datapipe: TarOpener = source_datapipe
        self.buffer = ShuffleBuffer(buffer_size, seed)

    def set_seed(self, seed: int) -> SampleShuffler:
        """Seed the buffer for the next epoch (the DataLoader calls this); a fixed seed rules."""
        self.buffer.shared = seed
        return self

    def set_shuffle(self, shuffle: bool = True) -> SampleShuffler:
        """Turn the buffer on or off (``DataLoader(pipe, shuffle=...)`` calls this)."""
        self.buffer.enabled = bool(shuffle)
        return self

    def _stream(self, wanted: frozenset[str] | None) -> Iterator[Sample]:
        opener = self.source_datapipe  # its reading holds the buffer, and saves it
        return opener.samples(self.buffer.shuffling(opener.source_datapipe))

    def __len__(self) -> int:
        return local_length(self)
