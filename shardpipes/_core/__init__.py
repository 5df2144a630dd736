"""Torch-free building blocks: the work of every stage, as plain functions and generators.

- the protocol every stage follows: :mod:`~shardpipes._core.stage` (state, reset, length,
  references), the epoch it is given: :mod:`~shardpipes._core.clock`;
- reading: :mod:`~shardpipes._core.buffer` (buffered, ranged, gzip reads) →
  :mod:`~shardpipes._core.tar` (members; one header in :mod:`~shardpipes._core.tar_headers`)
  → :mod:`~shardpipes._core.samples` (members grouped into samples), a worker's parts
  read in order by :mod:`~shardpipes._core.reading`; after reading,
  :mod:`~shardpipes._core.steps` (decode, fields, batch) and :mod:`~shardpipes._core.fields`;
- decoding: :mod:`~shardpipes._core.decoders` (the table), :mod:`~shardpipes._core.images`,
  :mod:`~shardpipes._core.tenbin`; writing: :mod:`~shardpipes._core.encoders`,
  :mod:`~shardpipes._core.writer`, :mod:`~shardpipes._core.index`;
- the split: :mod:`~shardpipes._core.split` (the plan), :mod:`~shardpipes._core.blocks`
  (``block_shuffle``), :mod:`~shardpipes._core.split_state` (what a loaded state must
  match); mixing, shuffling, prefetching: :mod:`~shardpipes._core.mixing`,
  :mod:`~shardpipes._core.shuffle`, :mod:`~shardpipes._core.prefetch`;
- errors: :mod:`~shardpipes._core.policy` and :mod:`~shardpipes._core.handlers`; shard
  patterns: :mod:`~shardpipes._core.braces`; what workers share:
  :mod:`~shardpipes._core.shared`.
"""
