"""Cassandra read-back and stack spec pieces that need no server: contact points, the stored.csv rows made from
CQL rows (entity ids named, write time in µs turned into ms), and the storage/readiness spec rules."""
import uuid

import pytest
from pydantic import ValidationError

from monsoon.observe.cassandra_store import _rows, split_contact_points
from monsoon.observe.storage import stored_source, write_stored
from monsoon.timeline.columnar import iter_dicts
from monsoon.spec.stack import ReadySpec, StorageSpec


def test_contact_points_share_one_port():
    assert split_contact_points(["127.0.0.1:9142", "127.0.0.2:9142"]) == (["127.0.0.1", "127.0.0.2"], 9142)
    assert split_contact_points(["db1"]) == (["db1"], 9042)
    with pytest.raises(ValueError, match="one port"):
        split_contact_points(["a:1", "b:2"])


def test_rows_name_entity_ids_and_turn_write_time_into_ms(tmp_path):
    known, unknown = uuid.uuid4(), uuid.uuid4()
    rows = [(known, 1, 1_700_000_000_123_456), (unknown, 2, None)]
    header, it = _rows(["entity_id", "seq", "stored_us"], iter(rows), {str(known): "dev-00001"})
    assert write_stored(tmp_path / "stored.csv", header, it) == 2
    got = list(iter_dicts(tmp_path / "stored.csv"))
    assert got == [{"device": "dev-00001", "seq": 1, "stored_ms": 1700000000123},
                   {"device": str(unknown), "seq": 2, "stored_ms": None}]


def test_rows_with_device_names_pass_through():
    header, it = _rows(["device", "seq"], iter([("d1", 3)]), {})
    assert header == ["device", "seq"] and list(it) == [("d1", 3)]


def test_storage_kinds_need_their_own_keys():
    s = StorageSpec(kind="cassandra", contact_points=["127.0.0.1:9042"], keyspace="thingsboard",
                    cql="SELECT entity_id, long_v AS seq FROM ts_kv_cf")
    src = stored_source(s)
    assert src.write is write_stored
    assert (src.hosts, src.port, src.keyspace) == (["127.0.0.1"], 9042, "thingsboard")
    with pytest.raises(ValidationError, match="cassandra needs keyspace, cql"):
        StorageSpec(kind="cassandra", contact_points=["127.0.0.1:9042"])
    with pytest.raises(ValidationError, match="postgres needs loss_query"):
        StorageSpec(dsn="postgresql://x")
    with pytest.raises(ValidationError, match="names_query needs dsn"):
        StorageSpec(kind="cassandra", contact_points=["h:1"], keyspace="k", cql="SELECT 1", names_query="SELECT 1")


def test_ready_cql_is_one_of_the_ways():
    assert ReadySpec(cql="127.0.0.1:{port:cassandra}").cql
    with pytest.raises(ValidationError, match="exactly one of tcp, http, log, cql"):
        ReadySpec(cql="127.0.0.1:1", tcp="127.0.0.1:1")
