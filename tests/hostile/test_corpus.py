"""Every case of the corruption corpus through open_tar, decode and a recipe.

Raising: one clear error naming the shard, the member and the offset. Skipping: the good
samples, by key, with a warning naming the bad one. Nothing sleeps, hangs, or allocates
what a size field asks.
"""

from __future__ import annotations

import time
import tracemalloc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shardpipes as sp
from shardpipes._core.handlers import ShardpipesWarning
from tests.hostile.corpus import (
    BAD,
    DECODE_CASES,
    END,
    HEAD,
    KEYS,
    TAR_CASES,
    Case,
    DecodeCase,
    all_but,
    member,
    sample,
    samples,
    with_size,
)

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Skipping a bad item must not sleep (WebDataset's handler sleeps 0.5 s per error)."""

    def sleep(seconds: float) -> None:
        msg = f"time.sleep({seconds}) while reading"
        raise AssertionError(msg)

    monkeypatch.setattr(time, "sleep", sleep)


def write(tmp_path: Path, name: str, data: bytes, *, gz: bool = False) -> str:
    path = tmp_path / (name + (".tar.gz" if gz else ".tar"))
    path.write_bytes(data)
    return str(path)


def keys_of(items: list[Any]) -> list[str]:
    return [item["__key__"] if isinstance(item, dict) else item[-1] for item in items]


Reader = Callable[[str, Any], list[Any]]
READERS: dict[str, Reader] = {
    "open_tar": lambda url, h: list(sp.list_shards(url).open_tar(handler=h)),
    "decode": lambda url, h: list(sp.list_shards(url).open_tar(handler=h).decode(handler=h)),
    "recipe": lambda url, h: list(
        sp.recipes.tar_shards(url, fields=("txt", "__key__"), shuffle=False, handler=h)
    ),
}


def check_error(exc: BaseException, url: str, member: str | None, match: str) -> None:
    """One error of a shardpipes type, naming the shard, the member and the offset."""
    assert isinstance(exc, sp.ShardpipesError)
    text = str(exc)
    assert exc.url == url, text
    assert text.startswith(url), text
    assert match.lower() in text.lower(), text
    if member is not None:
        assert exc.member == member, text
        assert repr(member) in text, text


def read_skipping(read: Reader, url: str) -> tuple[list[str], list[str]]:
    """The keys read with handler="warn", and the shardpipes warnings raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keys = keys_of(read(url, "warn"))
    return keys, [str(w.message) for w in caught if issubclass(w.category, ShardpipesWarning)]


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("name", list(TAR_CASES))
class TestTarCases:
    def test_raise(self, tmp_path: Path, name: str, reader: str) -> None:
        """handler="raise": the documented error, with the URL, member and byte offset."""
        case: Case = TAR_CASES[name]
        url = write(tmp_path, name, case.data(), gz=case.gz)
        if case.error is None:
            assert READERS[reader](url, "raise") == []
            return
        with pytest.raises(case.error) as info:
            READERS[reader](url, "raise")
        check_error(info.value, url, case.member, case.match)
        offset = info.value.offset  # type: ignore[attr-defined]
        assert offset is not None
        assert f"at byte {offset}" in str(info.value)

    def test_skip(self, tmp_path: Path, name: str, reader: str) -> None:
        """handler="warn": every good sample (by key), a warning naming the bad item."""
        case = TAR_CASES[name]
        url = write(tmp_path, name, case.data(), gz=case.gz)
        keys, warned = read_skipping(READERS[reader], url)
        assert keys == case.kept
        if case.error is None:
            assert warned == []
        else:
            assert warned
            assert all(url in w for w in warned), warned
            assert any(case.match.lower() in w.lower() for w in warned), warned


@pytest.mark.parametrize("name", list(DECODE_CASES))
class TestDecodeCases:
    @staticmethod
    def readers(case: DecodeCase) -> dict[str, Reader]:
        fields = (f"{case.ext};txt", "__key__")
        return {
            "decode": READERS["decode"],
            "recipe": lambda url, h: list(
                sp.recipes.tar_shards(url, fields=fields, shuffle=False, handler=h)
            ),
        }

    def test_raise(self, tmp_path: Path, name: str) -> None:
        """The decoder's failure as a DecodeError (or UnsafeDataError) naming the member."""
        case = DECODE_CASES[name]
        url = write(tmp_path, name, case.data())
        for read in self.readers(case).values():
            with pytest.raises(case.error) as info:
                read(url, "raise")
            check_error(info.value, url, f"{KEYS[BAD]}.{case.ext}", case.match)
            # the byte offset where the sample starts
            assert f"at byte {info.value.offset}" in str(info.value)  # type: ignore[attr-defined]
            assert info.value.offset == len(samples(range(BAD), case.extra))  # type: ignore[attr-defined]

    def test_skip(self, tmp_path: Path, name: str) -> None:
        """Skipping: the nine other samples, one warning naming the member."""
        case = DECODE_CASES[name]
        url = write(tmp_path, name, case.data())
        for read in self.readers(case).values():
            keys, warned = read_skipping(read, url)
            assert keys == all_but(BAD)
            assert len(warned) == 1
            assert f"{KEYS[BAD]}.{case.ext}" in warned[0]


def test_a_1gb_size_field_does_not_allocate_1gb(tmp_path: Path) -> None:
    """A header claiming 1 GB over a few KB: read in bounded pieces, then 'truncated'."""
    url = write(tmp_path, "gig", HEAD + with_size("big.txt", b"%011o\0" % 1_000_000_000))
    tracemalloc.start()
    try:
        with pytest.raises(sp.TarFormatError, match="truncated member"):
            list(sp.list_shards(url).open_tar())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak


def test_max_member_bytes_refuses_before_reading(tmp_path: Path) -> None:
    """A member over max_member_bytes is refused by its header; the others are read."""
    tail = b"".join(sample(i) for i in range(BAD, len(KEYS))) + END
    big = HEAD + member("big.txt", b"x" * (2 << 20)) + tail
    url = write(tmp_path, "big", big)
    with pytest.raises(sp.TarFormatError, match="max_member_bytes"):
        list(sp.list_shards(url).open_tar(max_member_bytes=1 << 20))
    pipe = sp.list_shards(url).open_tar(handler="ignore", max_member_bytes=1 << 20)
    assert keys_of(list(pipe)) == KEYS
    assert keys_of(list(sp.list_shards(url).open_tar())) == [*KEYS[:BAD], "big", *KEYS[BAD:]]
