"""The fault helpers inject what they claim, seen through s3fs directly (not shardpipes).

Retry layers (notes, section 2): botocore retries 5xx and connection errors before headers
(capped here at one attempt); s3fs retries SlowDown and payload errors (`fs.retries`
attempts); aiohttp itself resends an idempotent request once when a connection drops before
the response, unless the drop surfaces as a connector error.
"""

from __future__ import annotations

import errno
import functools
import http.client
import os
from collections.abc import Iterator
from typing import Any

import aiohttp
import botocore.exceptions
import pytest
import s3fs

from tests.cloud.faults import AWS_ENV, FaultyMoto, ResetProxy, Schedule

PATH = "faults-bucket/obj.bin"
PAYLOAD = os.urandom(2 * 2**20)
CUT = 64 * 2**10


@functools.lru_cache
def make_fs(endpoint_url: str, *, retries: int = 5) -> Any:
    """An s3fs client with botocore capped at one attempt, so only s3fs (and aiohttp) retry.

    Cached: a new client costs about 0.15 s, and werkzeug closes every connection anyway.
    """
    fs = s3fs.S3FileSystem(
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": endpoint_url},
        config_kwargs={"retries": {"total_max_attempts": 1}},
        skip_instance_cache=True,
    )
    fs.retries = retries
    return fs


@pytest.fixture(scope="module")
def moto_server() -> Iterator[FaultyMoto]:
    with FaultyMoto() as server:
        yield server


@pytest.fixture
def moto(moto_server: FaultyMoto) -> FaultyMoto:
    """The module's server with no fault, an empty log and the object in place."""
    fs = make_fs(moto_server.endpoint_url)
    fs.invalidate_cache()
    if not fs.exists(PATH):  # first use, or another FaultyMoto reset moto's global backends
        fs.mkdir(PATH.split("/")[0])
        fs.pipe_file(PATH, PAYLOAD)
    moto_server.clear(log=True)
    return moto_server


@pytest.fixture
def proxy(moto: FaultyMoto) -> Iterator[ResetProxy]:
    with ResetProxy(moto.host, moto.port) as p:
        yield p


class TestSchedule:
    @pytest.mark.parametrize(
        ("kwargs", "expected"),
        [
            ({}, [True] * 5),
            ({"times": 2}, [True, True, False, False, False]),
            ({"every": 2}, [False, True, False, True, False]),
            ({"every": 3}, [False, False, True, False, False]),
        ],
    )
    def test_pattern(self, kwargs: dict[str, int], expected: list[bool]) -> None:
        """The next `times` events, every `every`-th, or all of them get the fault."""
        schedule = Schedule(**kwargs)
        assert [schedule.take() for _ in expected] == expected

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"every": 0}, r"every must be a positive integer \(got 0\)"),
            ({"times": -1}, r"times must be a positive integer \(got -1\)"),
            ({"every": 1, "times": 1}, "not both"),
        ],
    )
    def test_bad_arguments(self, kwargs: dict[str, int], match: str) -> None:
        """Bad schedules are refused with the house wording."""
        with pytest.raises(ValueError, match=match):
            Schedule(**kwargs)


class TestFaultyMoto:
    def test_no_fault_logs_head_and_get(self, moto: FaultyMoto) -> None:
        """Without a fault a read succeeds and the log holds its requests and Range header."""
        fs = make_fs(moto.endpoint_url)
        assert fs.cat_file(PATH, start=10, end=20) == PAYLOAD[10:20]
        assert [(r.method, r.range) for r in moto.gets(PATH)] == [("GET", "bytes=10-19")]
        assert moto.faults_injected == 0

    def test_503_twice_is_retried_by_s3fs(self, moto: FaultyMoto) -> None:
        """Two SlowDowns are survived (s3fs matches 'SlowDown'): 3 GETs, data intact."""
        moto.inject("503", times=2)
        assert make_fs(moto.endpoint_url).cat_file(PATH) == PAYLOAD
        assert [r.fault for r in moto.gets(PATH)] == ["503", "503", None]

    def test_503_persistent_capped_raises_ebusy(self, moto: FaultyMoto) -> None:
        """A persistent SlowDown with every layer capped is OSError(EBUSY) after one GET."""
        moto.inject("503")
        with pytest.raises(OSError, match="reduce your request rate") as info:
            make_fs(moto.endpoint_url, retries=1).cat_file(PATH)
        assert info.value.errno == errno.EBUSY
        assert len(moto.gets(PATH)) == 1

    @pytest.mark.parametrize("retries", [1, 5])
    def test_500_is_not_retried_by_s3fs(self, moto: FaultyMoto, retries: int) -> None:
        """s3fs does not retry InternalError: OSError(EREMOTEIO) after one GET."""
        moto.inject("500")
        with pytest.raises(OSError, match="internal error") as info:
            make_fs(moto.endpoint_url, retries=retries).cat_file(PATH)
        assert info.value.errno == errno.EREMOTEIO
        assert len(moto.gets(PATH)) == 1

    def test_every_second_get(self, moto: FaultyMoto) -> None:
        """`every=2` faults GETs 2 and 4 only; HEADs are neither faulted nor counted."""
        moto.inject("503", every=2)
        fs = make_fs(moto.endpoint_url, retries=1)

        def read() -> bool:
            try:
                return bool(fs.cat_file(PATH, start=0, end=100) == PAYLOAD[:100])
            except OSError:
                return False

        outcomes = [read() for _ in range(4)]
        assert fs.info(PATH)["size"] == len(PAYLOAD)
        assert outcomes == [True, False, True, False]
        assert moto.faults_injected == 2
        assert [r.method for r in moto.requests][-1] == "HEAD"

    def test_truncated_body_is_retried(self, moto: FaultyMoto) -> None:
        """One truncated body is re-read by s3fs (ClientPayloadError is retryable): 2 GETs."""
        moto.inject("truncate", times=1, truncate_at=CUT)
        assert make_fs(moto.endpoint_url).cat_file(PATH) == PAYLOAD
        assert [r.fault for r in moto.gets(PATH)] == ["truncate", None]

    def test_truncated_body_capped_raises(self, moto: FaultyMoto) -> None:
        """With s3fs capped, the short body surfaces as aiohttp's ClientPayloadError."""
        moto.inject("truncate", truncate_at=CUT)
        with pytest.raises(aiohttp.ClientPayloadError, match=f"received {CUT} of {len(PAYLOAD)}"):
            make_fs(moto.endpoint_url, retries=1).cat_file(PATH)
        assert len(moto.gets(PATH)) == 1

    def test_environment_set_and_restored(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The AWS variables hold while it runs; the old ones (and AWS_PROFILE) come back."""
        monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
        monkeypatch.setenv("AWS_PROFILE", "real-account")
        with FaultyMoto() as server:
            assert {k: os.environ[k] for k in AWS_ENV} == AWS_ENV
            assert "AWS_PROFILE" not in os.environ
            assert server.storage_options == {
                "key": "testing",
                "secret": "testing",
                "client_kwargs": {"endpoint_url": server.endpoint_url},
            }
        assert os.environ["AWS_DEFAULT_REGION"] == "eu-west-3"
        assert os.environ["AWS_PROFILE"] == "real-account"

    def test_start_resets_moto(self, moto: FaultyMoto) -> None:
        """A second server resets moto's process-global backends: the bucket is gone."""
        with FaultyMoto() as other:
            assert not make_fs(other.endpoint_url).exists(PATH)


class TestResetProxy:
    def test_forwards_and_counts(self, moto: FaultyMoto, proxy: ResetProxy) -> None:
        """With no plan everything passes; one connection per request (werkzeug closes)."""
        assert make_fs(proxy.url).cat_file(PATH, start=0, end=len(PAYLOAD)) == PAYLOAD
        stats = proxy.stats
        assert (stats.accepted, stats.resets_on_accept, stats.cuts) == (1, 0, 0)
        assert stats.bytes_down > len(PAYLOAD) > stats.bytes_up > 0
        assert stats.bytes_forwarded == stats.bytes_up + stats.bytes_down

    def test_reset_every_second_connection(self, proxy: ResetProxy) -> None:
        """`every=2` resets connections 2 and 4 right after accept (raw HTTP, no retries)."""
        proxy.reset_on_accept(every=2)

        def get() -> int | str:
            conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=5)
            try:
                conn.request("GET", "/")
                return conn.getresponse().status
            except ConnectionError:  # RemoteDisconnected is one too
                return "reset"
            finally:
                conn.close()

        outcomes = [get() for _ in range(4)]
        assert outcomes == [200, "reset", 200, "reset"]
        assert (proxy.stats.accepted, proxy.stats.resets_on_accept) == (4, 2)

    def test_resets_on_accept_fail_a_capped_read(self, moto: FaultyMoto, proxy: ResetProxy) -> None:
        """Two resets on accept fail a capped read with EndpointConnectionError; no GET lands.

        aiohttp resends an idempotent request once after some resets (about 3 in 4 here) but
        not when the reset surfaces as ClientConnectorError, so one reset is not enough.
        """
        proxy.reset_on_accept(times=2)
        with pytest.raises(botocore.exceptions.EndpointConnectionError):
            make_fs(proxy.url, retries=1).cat_file(PATH, start=0, end=100)
        assert proxy.stats.accepted in (1, 2)
        assert proxy.stats.resets_on_accept == proxy.stats.accepted
        assert moto.gets(PATH) == []

    def test_cut_mid_body_is_retried(self, moto: FaultyMoto, proxy: ResetProxy) -> None:
        """An RST after 64 KiB: s3fs re-issues the same ranged GET and the data is intact."""
        proxy.cut_after(CUT, times=1)
        assert make_fs(proxy.url).cat_file(PATH, start=0, end=len(PAYLOAD)) == PAYLOAD
        assert proxy.stats.cuts == 1
        ranges = [r.range for r in moto.gets(PATH)]
        assert ranges == [f"bytes=0-{len(PAYLOAD) - 1}"] * 2

    def test_cut_mid_body_capped_raises(self, moto: FaultyMoto, proxy: ResetProxy) -> None:
        """With s3fs capped, the cut is a ClientPayloadError short of the Content-Length."""
        proxy.cut_after(CUT)
        with pytest.raises(aiohttp.ClientPayloadError, match=f"of {len(PAYLOAD)} bytes"):
            make_fs(proxy.url, retries=1).cat_file(PATH, start=0, end=len(PAYLOAD))
        assert proxy.stats.cuts == 1
        assert proxy.stats.bytes_down == CUT  # status line and headers count too

    def test_plan_changes_while_running(self, moto: FaultyMoto, proxy: ResetProxy) -> None:
        """`clear` stops the faults at once on a running proxy."""
        proxy.cut_after(0)
        proxy.reset_on_accept()
        proxy.clear()
        assert make_fs(proxy.url, retries=1).cat_file(PATH, start=0, end=10) == PAYLOAD[:10]
        assert proxy.stats.resets_on_accept == proxy.stats.cuts == 0

    def test_close_stops_listening(self, moto: FaultyMoto) -> None:
        """After the with block the port refuses connections."""
        with ResetProxy(moto.host, moto.port) as p:
            port = p.port
        with pytest.raises(ConnectionRefusedError):
            http.client.HTTPConnection("127.0.0.1", port, timeout=5).connect()
