"""Storage: the only package that talks to fsspec or the network.

Every function takes a URL in fsspec's grammar (a local path, ``file://``, ``memory://``,
``s3://``, ``gs://``, ``az://``, ``https://``, chained ``simplecache::s3://…``) and the
``storage_options`` given by the user, passed through unchanged to the filesystem.
Errors are translated into ones that name the URL: a missing file is a
:class:`~shardpipes.errors.ShardNotFoundError`, refused or missing credentials a
:class:`~shardpipes.errors.StorageAccessError`, a failure that outlasts the retries a
:class:`~shardpipes.errors.StorageError`, a missing backend an ``ImportError`` that says
which extra to install.

One module per responsibility:

- :mod:`~shardpipes.fs.backends`: which filesystem serves a URL, with shardpipes'
  timeouts and the backends' own retries off (shardpipes is the only retry layer);
- :mod:`~shardpipes.fs.files`: globs, listings, sizes, existence, outputs;
- :mod:`~shardpipes.fs.reads`: ranged reads, sizes, and :func:`open_input`'s streams;
- :mod:`~shardpipes.fs.readahead`: the blocks of remote shards fetched ahead, several at
  once (what it plans in :mod:`~shardpipes.fs.read_plan`, the file it opens in
  :mod:`~shardpipes.fs.readahead_file`, its threads in :mod:`~shardpipes.fs.io_threads`);
  :mod:`~shardpipes.fs.resilient`: a local or whole-file stream that resumes
  after a failure; :mod:`~shardpipes.fs.retry`: which failures are retried, how;
- :mod:`~shardpipes.fs.http_client`: plain ``http(s)://`` with the standard library;
  :mod:`~shardpipes.fs.cache`: the local shard cache; :mod:`~shardpipes.fs.fork`:
  fsspec's event loop made safe in forked workers (installed on import).
"""

from shardpipes.fs import fork
from shardpipes.fs.backends import (
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    backend_options,
    check_chained,
    is_remote,
    load_backend,
    url_to_fs,
)
from shardpipes.fs.files import (
    exists,
    glob,
    has_magic,
    is_folder,
    listdir,
    missing_files,
    open_output,
    remove_file,
    size,
    slow_to_check,
    walk,
)
from shardpipes.fs.reads import fetch_range, file_size, open_input, read_ahead
from shardpipes.fs.resilient import READ_STATS, ReadStats
from shardpipes.fs.retry import RetryPolicy

__all__ = [
    "CONNECT_TIMEOUT",
    "READ_STATS",
    "READ_TIMEOUT",
    "ReadStats",
    "RetryPolicy",
    "backend_options",
    "check_chained",
    "exists",
    "fetch_range",
    "file_size",
    "glob",
    "has_magic",
    "is_folder",
    "is_remote",
    "listdir",
    "load_backend",
    "missing_files",
    "open_input",
    "open_output",
    "read_ahead",
    "remove_file",
    "size",
    "slow_to_check",
    "url_to_fs",
    "walk",
]

fork.install()
