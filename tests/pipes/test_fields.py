import pickle
import re
from typing import Any

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

import shardpipes as sp
from shardpipes._core.handlers import ShardpipesWarning
from shardpipes.errors import MissingFieldError
from shardpipes.pipes.fields import TupleMaker

URL = "memory://train-000.tar"


def _sample(key: str, **fields: Any) -> dict[str, Any]:
    return {"__key__": key, "__url__": URL, **fields}


def _samples() -> list[dict[str, Any]]:
    return [
        _sample("a", jpg="A", cls=0),
        _sample("b", png="B", cls=1),
        _sample("c", cls=2),
        _sample("d", jpg="D", png="d", cls=3),
    ]


class TestTupleMaker:
    @pytest.mark.parametrize(
        ("fields", "expected"),
        [
            (("cls",), (0,)),
            (("jpg", "cls"), ("A", 0)),
            (("cls", "jpg"), (0, "A")),
            (("__key__", "__url__"), ("a", URL)),
            (("png;jpg",), ("A",)),
        ],
    )
    def test_fields_in_order(self, fields: tuple[str, ...], expected: tuple[Any, ...]) -> None:
        """Fields come out in the order asked, always as a tuple."""
        assert next(iter(TupleMaker(IterableWrapper(_samples()), *fields))) == expected

    @pytest.mark.parametrize(
        ("field", "expected"),
        [
            ("jpg;png", ["A", "B", "D"]),
            ("png;jpg", ["A", "B", "d"]),
            ("png ; jpg", ["A", "B", "d"]),
        ],
    )
    def test_alternatives_first_present_wins(self, field: str, expected: list[str]) -> None:
        """With ';' alternatives the first field present in the sample is taken."""
        samples = [s for s in _samples() if s["__key__"] != "c"]
        assert [t[0] for t in TupleMaker(IterableWrapper(samples), field)] == expected

    def test_missing_field_raises(self) -> None:
        """A missing field raises MissingFieldError naming the fields, key and url."""
        with pytest.raises(MissingFieldError) as info:
            list(TupleMaker(IterableWrapper(_samples()), "jpg;png", "cls"))
        error = info.value
        assert isinstance(error, KeyError)
        assert (error.url, error.key) == (URL, "c")
        for part in (URL, "'jpg' or 'png'", "'c'", "['cls']"):
            assert part in str(error)

    @pytest.mark.parametrize(
        ("fields", "error", "match"),
        [
            ((), ValueError, "at least one field"),
            ((3,), TypeError, r"fields must be strings \(got int\)"),
            (("jpg;",), ValueError, "separated by ';'"),
            (("",), ValueError, "separated by ';'"),
        ],
    )
    def test_invalid_fields(
        self, fields: tuple[Any, ...], error: type[Exception], match: str
    ) -> None:
        """Bad field arguments are refused at construction."""
        with pytest.raises(error, match=match):
            TupleMaker(IterableWrapper([]), *fields)

    def test_invalid_handler(self) -> None:
        """An unknown handler name is a ValueError."""
        with pytest.raises(ValueError, match="handler must be"):
            TupleMaker(IterableWrapper([]), "cls", handler="skip")

    def test_warn_skips_with_warning(self) -> None:
        """handler='warn' skips the sample lacking a field, with a warning, and goes on."""
        pipe = TupleMaker(IterableWrapper(_samples()), "jpg;png", "cls", handler="warn")
        with pytest.warns(ShardpipesWarning, match="'c'"):
            assert [t[1] for t in pipe] == [0, 1, 3]

    def test_ignore_skips_silently(self) -> None:
        """handler='ignore' skips the sample lacking a field without a warning."""
        pipe = TupleMaker(IterableWrapper(_samples()), "jpg", handler="ignore")
        assert list(pipe) == [("A",), ("D",)]

    @pytest.mark.parametrize("skip", [True, False])
    def test_callable_handler(self, skip: bool) -> None:
        """A callable handler gets the error and its context, and decides to skip or raise."""
        seen: list[dict[str, Any]] = []

        def handler(exc: BaseException, context: dict[str, Any]) -> bool:
            assert isinstance(exc, MissingFieldError)
            seen.append(context)
            return skip

        pipe = TupleMaker(IterableWrapper(_samples()), "png", handler=handler)
        if skip:
            assert list(pipe) == [("B",), ("d",)]
        else:
            with pytest.raises(MissingFieldError):
                list(pipe)
        assert seen[0] == {"stage": "to_tuple", "url": URL, "key": "a"}
        assert len(seen) == (2 if skip else 1)

    def test_functional_form_equals_constructor(self) -> None:
        """.to_tuple(...) gives the same output as TupleMaker(...)."""
        by_class = list(TupleMaker(IterableWrapper(_samples()), "cls", "__key__"))
        by_name = list(IterableWrapper(_samples()).to_tuple("cls", "__key__"))
        assert by_class == by_name == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]

    def test_pickle_round_trip(self) -> None:
        """A pickled and unpickled pipe yields the same tuples."""
        pipe = TupleMaker(IterableWrapper(_samples()), "jpg;png", handler="ignore")
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe) == [("A",), ("B",), ("D",)]

    def test_len(self) -> None:
        """len() is the source's length."""
        assert len(TupleMaker(IterableWrapper(_samples()), "cls")) == 4

    def test_len_without_source_length(self) -> None:
        """Without a source length, len() raises torch's TypeError naming the pipe, and why."""
        pipe = TupleMaker(IterableWrapper(_samples()).filter(bool), "cls")
        with pytest.raises(
            TypeError,
            match=r"^FilterIterDataPipe instance doesn't have valid length: shardpipes cannot count",
        ):
            len(pipe)


def test_rename_fields_takes_the_first_alternative() -> None:
    samples = [
        {"__key__": "a", "__url__": "u", "png": "A", "cls": 0, "txt": "x"},
        {"__key__": "b", "__url__": "u", "jpg": "B", "cls": 1},
    ]
    pipe = IterableWrapper(samples).rename_fields(image="jpg;png", label="cls")
    assert list(pipe) == [
        {"__key__": "a", "__url__": "u", "txt": "x", "image": "A", "label": 0},
        {"__key__": "b", "__url__": "u", "image": "B", "label": 1},
    ]
    only = IterableWrapper(samples).rename_fields(image="jpg;png", keep=False)
    assert [sorted(s) for s in only] == [["__key__", "__url__", "image"]] * 2
    with pytest.raises(MissingFieldError, match=r"no field 'webp'"):
        list(IterableWrapper(samples).rename_fields(image="webp"))
    with pytest.warns(ShardpipesWarning):
        kept = list(IterableWrapper(samples).rename_fields(text="txt", handler="warn"))
    assert [s["__key__"] for s in kept] == ["a"]
    with pytest.raises(ValueError, match="needs at least one new=old name"):
        IterableWrapper(samples).rename_fields()


def test_map_fields_applies_to_named_fields() -> None:
    samples = [{"__key__": "a", "cls": b"3", "txt": b"hi"}]
    pipe = IterableWrapper(samples).map_fields({"cls": int}, txt=bytes.decode)
    assert list(pipe) == [{"__key__": "a", "cls": 3, "txt": "hi"}]
    with pytest.raises(MissingFieldError, match=r"no field 'jpg'"):
        list(IterableWrapper(samples).map_fields(jpg=len))
    with pytest.raises(TypeError, match="not callable: \\['cls'\\]"):
        IterableWrapper(samples).map_fields({"cls": 3})


def test_a_chain_with_them_resumes_exactly(make_shards: Any) -> None:
    """rename_fields and map_fields hold nothing: StatefulDataLoader resumes the chain."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    import shardpipes as sp

    data = make_shards(4, 9)

    def chain() -> Any:
        return (
            sp.list_shards(data.urls)
            .split_shards(shuffle=True, seed=1)
            .open_tar()
            .shuffle_samples(buffer_size=5, seed=1)
            .rename_fields(label="cls", text="txt")
            .map_fields(label=int)
            .rename_fields({"cls": "label"})
            .to_tuple("__key__", "cls")
        )

    whole = [k for k, _ in StatefulDataLoader(chain(), batch_size=None, num_workers=2)]
    loader = StatefulDataLoader(chain(), batch_size=None, num_workers=2)
    it = iter(loader)
    before = [next(it)[0] for _ in range(13)]
    state = loader.state_dict()
    del it
    again = StatefulDataLoader(chain(), batch_size=None, num_workers=2)
    again.load_state_dict(state)
    assert before + [k for k, _ in again] == whole
    assert sorted(whole) == sorted(data.keys)


def test_cls_is_a_keyword_like_any_other() -> None:
    """The registered functions of torch take their class as a parameter named cls."""
    samples = IterableWrapper([_sample("a", cls=b"3", label=b"7")])
    assert next(iter(samples.map_fields(cls=int)))["cls"] == 3
    assert next(iter(samples.decode(cls=lambda b: int(b) * 10)))["cls"] == 30
    renamed = next(iter(samples.rename_fields(cls="label", keep=False)))
    assert renamed == {"__key__": "a", "__url__": URL, "cls": b"7"}


def test_stages_of_samples_given_urls_or_tuples_say_so_when_built() -> None:
    """Forgetting open_tar, or decoding after to_tuple: a TypeError naming the fix."""
    urls = ["a.tar"]
    with pytest.raises(TypeError, match=r"^to_tuple takes sample dicts; ShardLister yields shard"):
        sp.list_shards(urls).to_tuple("jpg", "cls")
    with pytest.raises(
        TypeError, match=r"^decode .* ShardSplitter yields shard URLs: put \.open_tar"
    ):
        sp.list_shards(urls).split_shards().decode("pil")
    with pytest.raises(TypeError, match=r"^decode .* TupleMaker yields tuples or batches: put it"):
        sp.list_shards(urls).open_tar().to_tuple("jpg").decode("pil")
    with pytest.raises(TypeError, match=r"^rename_fields .* yields tuples or batches"):
        sp.recipes.tar_shards(urls, batch_size=2).rename_fields(image="jpg")
    with pytest.raises(TypeError, match=r"^map_fields takes sample dicts; ShardLister"):
        sp.list_shards(urls).map_fields(jpg=len)
    # a recipe's batches of dicts (fields=()) are dicts: these stages take them
    batches = sp.recipes.tar_shards(urls, fields=(), batch_size=2)
    assert isinstance(batches.to_tuple("jpg", "cls"), TupleMaker)
    batches.rename_fields(image="jpg").map_fields(image=len)


def test_one_png_among_jpegs_names_the_fix() -> None:
    """A PNG in a pipeline of JPEGs: each error names rename_fields(image='jpg;png')."""
    import shardpipes as sp

    samples = [{"__key__": "a", "jpg": 1, "cls": 0}, {"__key__": "b", "png": 2, "cls": 1}]
    fix = re.escape(".rename_fields(image='jpg;png')")
    with pytest.raises(sp.MissingFieldError, match=fix):
        list(IterableWrapper(samples).map_fields(jpg=str))
    with pytest.raises(sp.MissingFieldError, match=fix):
        list(IterableWrapper(samples).to_tuple("jpg", "cls"))
    with pytest.raises(ValueError, match=fix + r"\) before \.batch"):
        list(IterableWrapper(samples).batch(2).collate(sp.collate_samples))
    fixed = IterableWrapper(samples).rename_fields(image="jpg;png").batch(2)
    batch = next(iter(fixed.collate(sp.collate_samples)))
    assert batch["image"].tolist() == [1, 2]
    with pytest.raises(sp.MissingFieldError) as plain:  # no image involved: no such hint
        list(IterableWrapper(samples).to_tuple("txt"))
    assert "rename_fields" not in str(plain.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_lambdas_pass_under_a_dataloader(make_shards: Any, workers: int) -> None:
    """decode(x=lambda), map_fields(x=lambda): torch's graph walk pickled them and failed."""
    from torch.utils.data import DataLoader

    import shardpipes as sp

    data = make_shards(2, 3)
    pipe = (
        sp.list_shards(data.urls).split_shards().open_tar()
        .decode(cls=lambda b: int(b) + 100).map_fields(cls=lambda c: c * 2).to_tuple("cls")
    )  # fmt: skip
    got = sorted(c for (c,) in DataLoader(pipe, batch_size=None, num_workers=workers))
    assert got == sorted((data.labels[k] + 100) * 2 for k in data.keys)
