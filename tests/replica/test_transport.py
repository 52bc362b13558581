"""The replication transport: blobs go to a buddy's server and come back intact, or not at all."""

from __future__ import annotations

import os
import socket
import threading
import zlib
from pathlib import Path

import pytest

from titan.replica import BlobInfo, DiskStore, MemoryStore, ReplicaClient, ReplicaError, ReplicaServer
from titan.replica.stores import check_set_id
from titan.replica.wire import REQUEST, send_frame
from titan.security.signing import Signer

pytestmark = pytest.mark.timeout(60)
KEY = b"k" * 32
CTX = "run-1"


@pytest.fixture(params=["memory", "disk"])
def server(request, tmp_path):
    store = MemoryStore() if request.param == "memory" else DiskStore(tmp_path / "store")
    srv = ReplicaServer(store, key=KEY, context=CTX, exports={"ckpt": tmp_path / "export"}, node="n1").start()
    yield srv
    srv.close()


def test_put_then_get_returns_the_same_bytes_and_crc(server, tmp_path):
    data = os.urandom(9 << 20) + b"tail"  # more than two transfer chunks
    f = tmp_path / "shard.bin"
    f.write_bytes(data)
    with ReplicaClient(KEY, context=CTX) as c:
        info = c.put(server.endpoint, "ckpt/step-00000010/n0", "__0_0.distcp", f, crc32=zlib.crc32(data))
        assert info == BlobInfo(len(data), zlib.crc32(data))
        c.put(server.endpoint, "ckpt/step-00000010/n0", "small", b"abc")
        assert c.get(server.endpoint, "ckpt/step-00000010/n0", "__0_0.distcp") == data
        out = tmp_path / "back.bin"
        got = c.get(server.endpoint, "ckpt/step-00000010/n0", "__0_0.distcp", into=out, expect=info)
        assert got == info and out.read_bytes() == data
        sets = c.list(server.endpoint, "ckpt/")
        assert set(sets) == {"ckpt/step-00000010/n0"} and set(sets["ckpt/step-00000010/n0"]) == {"__0_0.distcp", "small"}
        assert c.ping(server.endpoint)["store"] == server.store.kind


def test_a_crc_that_does_not_match_is_refused_and_nothing_stored(server):
    with ReplicaClient(KEY, context=CTX) as c:
        with pytest.raises(ReplicaError) as e:
            c.put(server.endpoint, "s", "b", b"hello", crc32=zlib.crc32(b"hellO"))
        assert e.value.kind == "corrupt", e.value
        assert c.list(server.endpoint) == {}, "a blob that failed its CRC was stored"


def test_expected_checksum_mismatch_on_fetch_writes_no_file(server, tmp_path):
    with ReplicaClient(KEY, context=CTX) as c:
        c.put(server.endpoint, "s", "b", b"payload")
        out = tmp_path / "x"
        with pytest.raises(ReplicaError) as e:
            c.get(server.endpoint, "s", "b", into=out, expect=BlobInfo(7, 1234))
        assert e.value.kind == "corrupt"
        assert not out.exists() and not list(tmp_path.glob(".x.fetch*")), list(tmp_path.iterdir())
        with pytest.raises(ReplicaError) as e:
            c.get(server.endpoint, "s", "missing")
        assert e.value.kind == "missing"


def test_another_jobs_key_is_refused_before_anything_is_stored(server):
    with ReplicaClient(b"x" * 32, context=CTX) as c:
        with pytest.raises(ReplicaError) as e:
            c.put(server.endpoint, "s", "b", b"evil")
        assert e.value.kind == "refused", e.value
    with ReplicaClient(KEY, context="other-run") as c:  # same key, another job's context
        with pytest.raises(ReplicaError) as e:
            c.list(server.endpoint)
        assert e.value.kind == "refused"
    assert server.store.list() == {} and server.refused >= 2


def _raw_request(endpoint: str, header: dict, payload: bytes = b"", *, tamper: bool = False) -> bytes:
    """Send one signed request by hand (optionally flipping a payload byte after signing)."""
    host, port = endpoint.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    try:
        class Tap:
            def __init__(self) -> None:
                self.buf = bytearray()

            def sendall(self, b) -> None:  # noqa: ANN001
                self.buf += bytes(b)

        tap = Tap()
        send_frame(tap, Signer(KEY), REQUEST, CTX, header, payload)  # type: ignore[arg-type]
        raw = bytearray(tap.buf)
        if tamper:
            raw[-33] ^= 0x01  # last payload byte, before the 32-byte tag
        s.sendall(raw)
        return s.recv(65536)
    finally:
        s.close()


def test_replayed_and_altered_requests_are_refused(server):
    import time

    hdr = {"op": "put", "set": "s", "name": "b", "crc32": None, "nonce": "a" * 24, "t": time.time()}
    _raw_request(server.endpoint, hdr, b"first")
    assert server.store.list() == {"s": {"b": BlobInfo(5, zlib.crc32(b"first"))}}
    server.store.drop("s")
    _raw_request(server.endpoint, hdr, b"first")  # the same recorded request again
    assert server.store.list() == {}, "a replayed request was executed"
    old = {**hdr, "nonce": "b" * 24, "t": time.time() - 3600}
    _raw_request(server.endpoint, old, b"first")
    assert server.store.list() == {}, "a stale request was executed"
    _raw_request(server.endpoint, {**hdr, "nonce": "c" * 24, "t": time.time()}, b"second", tamper=True)
    assert server.store.list() == {}, "a payload altered after signing was stored"


def test_exports_serve_regular_files_inside_the_folder_only(server, tmp_path):
    exp = tmp_path / "export" / "step-00000010"
    exp.mkdir(parents=True)
    (exp / "__0_0.distcp").write_bytes(b"shard0")
    (tmp_path / "secret").write_text("outside")
    os.symlink(tmp_path / "secret", exp / "link")
    with ReplicaClient(KEY, context=CTX) as c:
        assert c.get(server.endpoint, "@ckpt/step-00000010", "__0_0.distcp",
                     expect=BlobInfo(6, zlib.crc32(b"shard0"))) == b"shard0"
        for set_id, name in (("@ckpt/step-00000010", "link"), ("@ckpt/..", "secret"), ("@nope", "x")):
            with pytest.raises(ReplicaError) as e:
                c.get(server.endpoint, set_id, name)
            assert e.value.kind in ("missing", "bad_request"), (set_id, name, e.value)


def test_retain_and_drop(server):
    with ReplicaClient(KEY, context=CTX) as c:
        for step in (10, 20, 30):
            c.put(server.endpoint, f"ckpt/step-{step:08d}/n0", "a", b"x" * step)
        c.put(server.endpoint, "snap/rank0", "state", b"s")
        dropped = c.retain(server.endpoint, "ckpt", ["ckpt/step-00000030/n0"])
        assert sorted(dropped) == ["ckpt/step-00000010/n0", "ckpt/step-00000020/n0"]
        assert set(c.list(server.endpoint)) == {"ckpt/step-00000030/n0", "snap/rank0"}
        assert c.drop(server.endpoint, "snap/rank0") == 1


@pytest.mark.parametrize("bad", ["", "..", "a/../b", "/abs", ".hidden", "a//b", "x" * 200])
def test_set_ids_never_name_a_path_outside_the_store(bad):
    with pytest.raises(ReplicaError):
        check_set_id(bad)


def test_disk_store_keeps_blobs_across_a_restarted_server(tmp_path):
    store = DiskStore(tmp_path / "s")
    with ReplicaServer(store, key=KEY, context=CTX) as srv, ReplicaClient(KEY, context=CTX) as c:
        c.put(srv.endpoint, "ckpt/step-00000005/n0", "a", b"durable")
    again = DiskStore(tmp_path / "s")  # what a relaunched titan run opens
    assert again.list() == {"ckpt/step-00000005/n0": {"a": BlobInfo(7, zlib.crc32(b"durable"))}}
    (tmp_path / "s" / "ckpt" / "step-00000005" / "n0" / "a").write_bytes(b"rotten!")
    with ReplicaServer(again, key=KEY, context=CTX) as srv, ReplicaClient(KEY, context=CTX) as c:
        with pytest.raises(ReplicaError) as e:
            c.get(srv.endpoint, "ckpt/step-00000005/n0", "a")
        assert e.value.kind == "corrupt", "a blob that rotted on disk was handed out"


def test_memory_store_bound_refuses_what_does_not_fit():
    with ReplicaServer(MemoryStore(max_bytes=100), key=KEY, context=CTX) as srv, ReplicaClient(KEY, context=CTX) as c:
        c.put(srv.endpoint, "s", "a", b"x" * 60)
        with pytest.raises(ReplicaError) as e:
            c.put(srv.endpoint, "s", "b", b"x" * 60)
        assert e.value.kind == "full"
        c.put(srv.endpoint, "s", "a", b"y" * 90)  # replacing a blob frees its old size
        assert c.get(srv.endpoint, "s", "a") == b"y" * 90


def test_parallel_clients_each_get_their_own_blob(server):
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            with ReplicaClient(KEY, context=CTX) as c:
                data = bytes([i]) * (200_000 + i)
                c.put(server.endpoint, f"snap/rank{i}", "state", data)
                assert c.get(server.endpoint, f"snap/rank{i}", "state") == data
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not errors, errors


def test_a_server_that_is_gone_is_reported_unreachable(tmp_path):
    srv = ReplicaServer(MemoryStore(), key=KEY, context=CTX).start()
    ep = srv.endpoint
    srv.close()
    with ReplicaClient(KEY, context=CTX, timeout_s=2) as c:
        with pytest.raises(ReplicaError) as e:
            c.ping(ep)
        assert e.value.kind in ("unreachable", "timeout")


def test_listener_binds_the_address_asked_for():
    with ReplicaServer(MemoryStore(), key=KEY, context=CTX, addr="127.0.0.1") as srv:
        assert srv._sock.getsockname()[0] == "127.0.0.1"
