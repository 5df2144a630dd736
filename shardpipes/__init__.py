"""shardpipes: composable PyTorch DataPipes that stream samples out of sharded tar archives.

Importing the package registers every functional form on ``IterDataPipe``:
``split_shards``, ``open_tar``, ``decode``, ``to_tuple``. Chain them after
:func:`list_shards`, with torch core's ``shuffle``, ``sharding_filter``, ``map``, ``batch``
and ``collate``::

    import shardpipes as sp
    pipe = (sp.list_shards("data/train-{000000..000127}.tar")
              .split_shards(shuffle=True)
              .open_tar()
              .decode("pil")
              .to_tuple("jpg;png", "cls"))
"""

from shardpipes import _patches, recipes
from shardpipes._core.handlers import ShardpipesWarning
from shardpipes._core.policy import ErrorPolicy, Stats
from shardpipes._core.split import ShardPart, shard_order, split_plan
from shardpipes.errors import (
    DecodeError,
    MissingFieldError,
    NoShardsError,
    ShardIndexError,
    ShardNotFoundError,
    ShardpipesError,
    StorageAccessError,
    StorageError,
    TarFormatError,
    TooManyErrorsError,
    UnsafeDataError,
)
from shardpipes.nodes import to_node
from shardpipes.pipes._stage import stats_of as pipe_stats
from shardpipes.pipes.collate import Batch, BatchDict, collate_samples
from shardpipes.pipes.cycle import EpochCycler
from shardpipes.pipes.decode import DecodeOptions, SampleDecoder
from shardpipes.pipes.elastic import resume_from
from shardpipes.pipes.epoch import set_epoch
from shardpipes.pipes.fields import FieldMapper, FieldRenamer, TupleMaker
from shardpipes.pipes.index import build_index, read_index, write_index
from shardpipes.pipes.limit import SampleLimiter
from shardpipes.pipes.mix import Mixer, mix
from shardpipes.pipes.prefetch import ItemPrefetcher
from shardpipes.pipes.reader import ReadOptions
from shardpipes.pipes.resumable import Resumable
from shardpipes.pipes.shards import ShardLister
from shardpipes.pipes.shuffle import SampleShuffler
from shardpipes.pipes.split import ShardSplitter
from shardpipes.pipes.tar import TarOpener
from shardpipes.writing import ShardWriter, TarWriter

_patches.install()  # the plain StatefulDataLoader(pipe) resumes exactly; see the module

__version__ = "0.1.0"

list_shards = ShardLister

__all__ = [
    "Batch",
    "BatchDict",
    "DecodeError",
    "DecodeOptions",
    "EpochCycler",
    "ErrorPolicy",
    "FieldMapper",
    "FieldRenamer",
    "ItemPrefetcher",
    "MissingFieldError",
    "Mixer",
    "NoShardsError",
    "ReadOptions",
    "Resumable",
    "SampleDecoder",
    "SampleLimiter",
    "SampleShuffler",
    "ShardIndexError",
    "ShardLister",
    "ShardNotFoundError",
    "ShardPart",
    "ShardSplitter",
    "ShardWriter",
    "ShardpipesError",
    "ShardpipesWarning",
    "Stats",
    "StorageAccessError",
    "StorageError",
    "TarFormatError",
    "TarOpener",
    "TarWriter",
    "TooManyErrorsError",
    "TupleMaker",
    "UnsafeDataError",
    "__version__",
    "build_index",
    "collate_samples",
    "list_shards",
    "mix",
    "pipe_stats",
    "read_index",
    "recipes",
    "resume_from",
    "set_epoch",
    "shard_order",
    "split_plan",
    "to_node",
    "write_index",
]
