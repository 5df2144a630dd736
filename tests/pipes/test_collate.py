import copy
import pickle
import re
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import PIL.Image
import pytest
import torch
import torch.multiprocessing  # registers torch.Tensor with ForkingPickler
from torch.utils.data import DataLoader
from torch.utils.data.datapipes.iter import IterableWrapper

from shardpipes.pipes.collate import Batch, BatchDict, collate_samples


def _image(
    size: tuple[int, int] = (4, 2), mode: str = "RGB", color: Any = "red"
) -> PIL.Image.Image:
    return PIL.Image.new(mode, size, color)


def _samples(n: int = 3) -> list[dict[str, Any]]:
    return [
        {
            "__key__": f"k{i}",
            "__url__": "memory://s.tar",
            "jpg": _image(color=(i, 0, 0)),
            "cls": i,
            "npy": np.full((2, 2), i, dtype=np.float32),
            "txt": f"t{i}",
            "raw": bytes([i]),
        }
        for i in range(n)
    ]


IMAGES = (
    "images of different sizes. Decode them to one size with resize= and crop= on the recipe "
    '(tar_shards(..., resize=256, crop=224)) or on decode (.decode("torch", resize=256, '
    "crop=224)); or resize them in a map() before batching"
)


class TestTorchCoreCollate:
    def test_default_collate_fails_on_pil_images(self) -> None:
        """Torch core's .batch().collate() fails on PIL images (why collate_samples exists)."""
        pipe = IterableWrapper(_samples()).batch(2).collate()
        with pytest.raises(TypeError, match="PIL"):
            list(pipe)

    def test_default_collate_stacks_dict_fields(self) -> None:
        """Torch core's .collate() stacks ints and arrays of dict samples, lists strings."""
        samples = [{k: v for k, v in s.items() if k != "jpg"} for s in _samples()]
        [batch] = list(IterableWrapper(samples).batch(3).collate())
        assert batch["cls"].tolist() == [0, 1, 2]
        assert batch["txt"] == ["t0", "t1", "t2"]


class TestCollateSamples:
    def test_dict_batch(self) -> None:
        """Dict samples collate to a dict of stacked tensors and lists."""
        batch = collate_samples(_samples())
        assert batch["__key__"] == ["k0", "k1", "k2"]
        assert batch["txt"] == ["t0", "t1", "t2"]
        assert batch["raw"] == [b"\x00", b"\x01", b"\x02"]
        assert (batch["cls"].dtype, batch["cls"].tolist()) == (torch.int64, [0, 1, 2])
        assert (batch["npy"].dtype, tuple(batch["npy"].shape)) == (torch.float32, (3, 2, 2))
        assert batch["npy"][2].tolist() == [[2.0, 2.0], [2.0, 2.0]]

    def test_pil_images_become_uint8_chw(self) -> None:
        """RGB PIL images become a uint8 (B, 3, H, W) tensor with their pixels."""
        images = collate_samples(_samples())["jpg"]
        assert (images.dtype, tuple(images.shape)) == (torch.uint8, (3, 3, 2, 4))
        assert images[:, :, 0, 0].tolist() == [[0, 0, 0], [1, 0, 0], [2, 0, 0]]

    @pytest.mark.parametrize(
        ("mode", "channels"), [("L", 1), ("RGB", 3), ("RGBA", 4), ("P", 3), ("1", 3), ("I", 3)]
    )
    def test_image_modes(self, mode: str, channels: int) -> None:
        """L keeps 1 channel, RGBA 4; other modes are converted to RGB."""
        images = collate_samples([{"png": _image(mode=mode, color=1)}] * 2)["png"]
        assert (images.dtype, tuple(images.shape)) == (torch.uint8, (2, channels, 2, 4))

    def test_read_only_arrays(self) -> None:
        """Read-only numpy arrays collate without a warning."""
        array = np.arange(4)
        array.flags.writeable = False
        assert collate_samples([(array,), (array,)])[0].tolist() == [[0, 1, 2, 3]] * 2

    def test_tuple_batch(self) -> None:
        """Tuple samples collate to a list of batched fields, as default_collate does."""
        batch = collate_samples([(_image(), 1, "a"), (_image(), 2, "b")])
        assert type(batch) is Batch
        assert tuple(batch[0].shape) == (2, 3, 2, 4)
        assert batch[1].tolist() == [1, 2]
        assert batch[2] == ["a", "b"]

    @pytest.mark.parametrize(
        ("values", "dtype"),
        [
            ([1.5, 2.5], torch.float64),
            ([True, False], torch.bool),
            ([np.int16(3), np.int16(4)], torch.int16),
        ],
    )
    def test_other_values_go_to_default_collate(
        self, values: list[Any], dtype: torch.dtype
    ) -> None:
        """Floats, bools and numpy scalars are left to default_collate."""
        assert collate_samples([{"x": v} for v in values])["x"].dtype == dtype

    def test_dicts_and_lists_are_kept_as_lists(self) -> None:
        """Decoded json (ragged lists too): one value per sample, as wds; .ten stacked."""
        meta = [{"uid": i, "boxes": [[0, 0, 1, 1]] * (i + 1)} for i in range(3)]
        tags = [["a"] * i for i in range(3)]
        tens = [[np.zeros(2), np.full((2, 2), i)] for i in range(3)]
        batch = collate_samples(
            [{"json": m, "tags": g, "ten": t} for m, g, t in zip(meta, tags, tens, strict=True)]
        )
        assert batch["json"] == meta
        assert batch["tags"] == tags
        assert [t.shape for t in batch["ten"]] == [(3, 2), (3, 2, 2)]  # stacked by position

    def test_what_default_collate_cannot_batch_names_the_field(self) -> None:
        with pytest.raises(RuntimeError, match=r"^field 'pair': cannot batch its values \(tupl"):
            collate_samples([{"pair": (1,)}, {"pair": (1, 2)}])

    @pytest.mark.parametrize(
        ("batch", "message"),
        [
            (
                [{"jpg": _image((32, 32))}, {"jpg": _image((32, 40))}],
                "field 'jpg': cannot batch tensors of shapes (3, 32, 32) and (3, 40, 32): "
                + IMAGES,
            ),
            (
                [(np.zeros((2, 3)),), (np.zeros((2, 4)),)],
                "field 0: cannot batch tensors of shapes (2, 3) and (2, 4); "
                "make them one shape in a map() before batching",
            ),
            (
                [{"t": torch.zeros(2)}, {"t": torch.zeros(2)}, {"t": torch.zeros(5)}],
                "field 't': cannot batch tensors of shapes (2,) and (5,); "
                "make them one shape in a map() before batching",
            ),
        ],
    )
    def test_shape_mismatch(self, batch: list[Any], message: str) -> None:
        """Tensors of different shapes raise ValueError naming the field and both shapes."""
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            collate_samples(batch)

    @pytest.mark.parametrize(
        ("batch", "match"),
        [
            ([], "at least one sample"),
            ([{"a": 1}, {"b": 1}], "same fields"),
            ([(1, 2), (1,)], "same lengths"),
        ],
    )
    def test_bad_batches(self, batch: list[Any], match: str) -> None:
        """Empty batches and samples that disagree on fields are refused."""
        with pytest.raises(ValueError, match=match):
            collate_samples(batch)

    def test_in_pipe(self) -> None:
        """Works as torch core's .batch(n).collate(collate_samples), last batch short."""
        batches = list(IterableWrapper(_samples(5)).batch(2).collate(collate_samples))
        assert [b["cls"].tolist() for b in batches] == [[0, 1], [2, 3], [4]]
        assert tuple(batches[0]["jpg"].shape) == (2, 3, 2, 4)

    def test_as_dataloader_collate_fn(self) -> None:
        """Works as a DataLoader's collate_fn."""
        loader = DataLoader(IterableWrapper(_samples(4)), batch_size=2, collate_fn=collate_samples)
        assert [b["__key__"] for b in loader] == [["k0", "k1"], ["k2", "k3"]]


class TestBatchTransfer:
    """Batches cross process boundaries with small tensors inline, large ones shared."""

    @pytest.mark.parametrize("cls", [Batch, BatchDict])
    def test_pickle_round_trip(self, cls: type[Any]) -> None:
        small, large = torch.arange(8), torch.zeros(70_000, dtype=torch.uint8)
        fields = [small, large, ["a", "b"], torch.ones(2, dtype=torch.bfloat16)]
        batch = cls(enumerate(fields)) if cls is BatchDict else cls(fields)
        data = ForkingPickler.dumps(batch)
        back = pickle.loads(data)
        assert type(back) is cls
        values = list(back.values()) if cls is BatchDict else list(back)
        assert values[0].tolist() == small.tolist() and values[0].dtype == small.dtype
        assert values[1].shape == large.shape and values[2] == ["a", "b"]
        assert values[3].dtype == torch.bfloat16

    def test_small_tensors_travel_inline(self) -> None:
        """The small tensor's bytes are in the pickle; the large one's are not (shared memory)."""
        small = torch.full((1000,), 7, dtype=torch.int64)  # 8,000 bytes
        large = torch.full((200_000,), 7, dtype=torch.uint8)
        assert len(ForkingPickler.dumps(Batch([small]))) > small.nbytes
        assert len(ForkingPickler.dumps(Batch([large]))) < 10_000
        assert len(ForkingPickler.dumps([small])) < 10_000  # a plain list shares it

    def test_copy_keeps_the_type(self) -> None:
        batch = Batch([torch.arange(3)])
        assert type(copy.copy(batch)) is Batch and copy.copy(batch)[0] is batch[0]

    @pytest.mark.slow
    def test_through_dataloader_workers(self) -> None:
        pipe = IterableWrapper([(i, f"k{i}") for i in range(40)]).sharding_filter()
        loader = DataLoader(pipe.batch(4).collate(collate_samples), batch_size=None, num_workers=2)
        batches = list(loader)
        assert all(type(b) is Batch for b in batches)
        assert sorted(v for b in batches for v in b[0].tolist()) == list(range(40))
