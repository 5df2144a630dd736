"""Our functional forms collide with nobody's and match the README's table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from torch.utils.data import IterDataPipe

# IterDataPipe.functions in torch 2.13.0 before anything else is imported.
TORCH_CORE = frozenset(
    [
        "_dataframes_as_tuples",
        "_dataframes_concat",
        "_dataframes_filter",
        "_dataframes_per_row",
        "_dataframes_shuffle",
        "_to_dataframes_pipe",
        "batch",
        "collate",
        "concat",
        "demux",
        "filter",
        "fork",
        "groupby",
        "list_files",
        "map",
        "mux",
        "open_files",
        "read_from_stream",
        "routed_decode",
        "sharding_filter",
        "shuffle",
        "trace_as_dataframe",
        "unbatch",
        "zip",
    ]
)
# Every @functional_datapipe name of torchdata 0.9.0's iter datapipes (read from its wheel).
TORCHDATA_09 = frozenset(
    [
        "add_index",
        "async_map_batches",
        "bucketbatch",
        "check_hash",
        "cycle",
        "dataframe",
        "decompress",
        "drop",
        "end_caching",
        "enumerate",
        "extract",
        "flatmap",
        "flatten",
        "fullsync",
        "header",
        "in_batch_shuffle",
        "in_memory_cache",
        "lines_to_paragraphs",
        "list_files_by_ais",
        "list_files_by_fsspec",
        "list_files_by_iopath",
        "list_files_by_s3",
        "load_files_by_ais",
        "load_files_by_s3",
        "load_from_bz2",
        "load_from_rar",
        "load_from_tar",
        "load_from_tfrecord",
        "load_from_xz",
        "load_from_zip",
        "load_parquet_as_df",
        "map_batches",
        "max_token_bucketize",
        "memory_cell",
        "mux_longest",
        "on_disk_cache",
        "open_files_by_fsspec",
        "open_files_by_iopath",
        "parse_csv",
        "parse_csv_as_dict",
        "parse_json_files",
        "pin_memory",
        "prefetch",
        "random_split",
        "read_from_gdrive",
        "read_from_http",
        "read_from_remote",
        "readlines",
        "repeat",
        "round_robin_demux",
        "rows2columnar",
        "save_by_fsspec",
        "save_by_iopath",
        "save_to_disk",
        "set_length",
        "shard_expand",
        "sharding_round_robin_dispatch",
        "shuffled_flatmap",
        "slice",
        "threadpool_map",
        "to_map_datapipe",
        "unzip",
        "webdataset",
        "zip_longest",
        "zip_with_iter",
        "zip_with_map",
    ]
)

PROBE = """
import json
from torch.utils.data import IterDataPipe
before = set(IterDataPipe.functions)
import shardpipes
print(json.dumps({"before": sorted(before), "ours": sorted(set(IterDataPipe.functions) - before)}))
"""


def registered() -> tuple[set[str], set[str]]:
    out = subprocess.run([sys.executable, "-c", PROBE], check=True, capture_output=True, text=True)
    data = json.loads(out.stdout)
    return set(data["before"]), set(data["ours"])


def test_torch_core_list_is_current() -> None:
    """The frozen torch core list is what this torch registers (update it on a torch bump)."""
    before, _ = registered()
    assert before == TORCH_CORE


def test_ours_are_disjoint_and_documented() -> None:
    """Ours: new names, not torch core's, not torchdata 0.9's, not IterDataPipe attributes."""
    _, ours = registered()
    assert ours == {
        "split_shards", "open_tar", "shuffle_samples", "decode", "to_tuple", "rename_fields",
        "map_fields", "limit_samples", "cycle_epochs", "prefetch_items",
    }  # fmt: skip
    assert not ours & TORCH_CORE
    assert not ours & TORCHDATA_09
    assert not ours & set(dir(IterDataPipe))
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    table = readme.split("## Pipes", 1)[1].split("\n\n| source", 1)[0]
    assert set(re.findall(r"^\| `(\w+)` \|", table, flags=re.M)) == ours


def test_their_names_are_answered_with_ours() -> None:
    """pipe.header(n) and the like: the error names the shardpipes form, which exists."""
    import pytest

    import shardpipes as sp
    from shardpipes.pipes._stage import HINTS

    pipe = sp.list_shards(["a.tar"]).open_tar()
    for name, hint in HINTS.items():
        with pytest.raises(AttributeError, match=rf"no attribute '{name}': with shardpipes, use"):
            getattr(pipe, name)
        for form in re.findall(r"(?<![\w.])\.(\w+)\(", hint):
            assert form in IterDataPipe.functions, (name, form)
    with pytest.raises(AttributeError, match=r"no attribute 'no_such_stage") as info:
        pipe.no_such_stage  # noqa: B018 - the attribute access is the test
    assert "shardpipes" not in str(info.value)  # torch's own error, untouched
    assert not hasattr(pipe, "header")


def test_webdatasets_shuffle_1000_says_what_to_write() -> None:
    """pipe.shuffle(1000) is torch's keyword-only shuffle: the error names shuffle_samples."""
    import pytest
    from torch.utils.data.datapipes.iter import Shuffler

    import shardpipes as sp

    pipe = sp.list_shards(["a.tar"]).split_shards().open_tar()
    with pytest.raises(TypeError, match=r"use \.shuffle_samples\(1000\) right after \.open_tar"):
        pipe.shuffle(1000)
    assert isinstance(pipe.shuffle(buffer_size=10), Shuffler)  # torch's, by keyword
    assert pipe.shuffle_samples(1000).buffer_size == 1000  # ours takes it by position
