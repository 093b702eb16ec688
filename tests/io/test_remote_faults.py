"""Bounded failure for remote reads (issue 28), through a fault-injecting HTTP proxy on 127.0.0.1
in front of moto's S3 server (tests/io/fault_proxy.py): a persistent 503, dropped connections,
short bodies and a store slower than the per-try timeout each raise within the retry policy
(PACKER_REMOTE_ATTEMPTS / _TIMEOUT / _DEADLINE, kept small here), naming the file, after at most
that many requests (pyarrow's own retries are off underneath); the same reads pass untouched."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from packer.io import ranged
from packer.store.dataset import open_dataset

sys.path.insert(0, str(Path(__file__).parent))
from fault_proxy import FaultProxy  # noqa: E402

BUCKET = "packer-faults"


@pytest.fixture(scope="module")
def store(sample_dataset):
    """(proxy, uri of the sample dataset through it)."""
    server_module = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3 = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                      aws_access_key_id="testing", aws_secret_access_key="testing")
    s3.create_bucket(Bucket=BUCKET)
    for p in sorted(Path(sample_dataset).iterdir()):
        if p.is_file():
            s3.upload_file(str(p), BUCKET, f"ds/{p.name}")
    proxy = FaultProxy(host, port, slow_seconds=4.0)
    query = f"endpoint_override=127.0.0.1:{proxy.port}&scheme=http&region=us-east-1&allow_delayed_open=true"
    yield proxy, f"s3://testing:testing@{BUCKET}/ds?{query}", s3
    proxy.close()
    server.stop()


@pytest.fixture(autouse=True)
def small_policy(monkeypatch):
    monkeypatch.setenv("PACKER_REMOTE_ATTEMPTS", "3")
    monkeypatch.setenv("PACKER_REMOTE_TIMEOUT", "1")
    monkeypatch.setenv("PACKER_REMOTE_DEADLINE", "2.5")


def _fault(proxy, fault):
    proxy.fault, proxy.gets = fault, 0


@pytest.mark.parametrize("fault", ["503", "drop", "short", "slow"])
def test_a_persistent_fault_at_open_raises_within_the_policy(store, fault):
    proxy, uri, _ = store
    _fault(proxy, fault)
    try:
        with pytest.raises(OSError, match=r"packer-faults/ds.* read failed \d times") as raised:
            open_dataset(uri)
    finally:
        proxy.fault = None
    assert "testing:testing" not in str(raised.value)
    # one request a try, no retries under packer's (a dropped keep-alive connection: curl opens a fresh one once)
    assert proxy.gets <= 3 * (2 if fault == "drop" else 1), proxy.gets
    assert len(open_dataset(uri)) > 0  # the store healed: the same open works


@pytest.mark.parametrize("fault", ["503", "slow"])
def test_a_block_read_names_the_file_and_the_byte_range(store, sample_dataset, fault):
    proxy, uri, _ = store
    ds = open_dataset(uri)
    shard = ds.path / ds.manifest["shards"][0]["file"]
    _fault(proxy, fault)
    try:
        with pytest.raises(OSError, match=r"shard-00000\.arrow.* bytes 0-4096: read failed"):
            ranged.read_range(shard, 0, 4096)
    finally:
        proxy.fault = None
    local = (Path(sample_dataset) / shard.name).read_bytes()[:4096]
    assert bytes(ranged.read_range(shard, 0, 4096)) == local  # healed: the same read, the stored bytes


def test_a_shrunk_object_is_a_short_read_not_zeros(store, sample_dataset):
    proxy, uri, s3 = store
    ds = open_dataset(uri)
    name = ds.manifest["shards"][-1]["file"]
    shard = ds.path / name
    size = (Path(sample_dataset) / name).stat().st_size
    ranged.read_range(shard, size - 100, size)  # a handle opened on the whole object
    s3.put_object(Bucket=BUCKET, Key=f"ds/{name}", Body=(Path(sample_dataset) / name).read_bytes()[: size // 2])
    try:
        with pytest.raises(OSError, match=name):
            ranged.read_range(shard, size - 100, size)
    finally:
        s3.upload_file(str(Path(sample_dataset) / name), BUCKET, f"ds/{name}")
