"""API keys across hosts: the shared token bucket in the event log (`online.serve.rate_limit = "shared"`) and
revocation, on a real SQLite file (WAL) opened by two `EventLog`s as two hosts would. The same statements on
PostgreSQL: tests/integration/test_online_postgres.py."""

import threading

import pytest

from flywheel.online.events import EventLog
from flywheel.online.keys import new_key


def test_the_shared_bucket_is_a_token_bucket(tmp_path):
    log = EventLog(tmp_path / "online.db")
    assert [log.take_token("k", 2, now=100.0)[0] for _ in range(3)] == [True, True, False]
    ok, retry = log.take_token("k", 2, now=100.0)
    assert not ok and retry == pytest.approx(30.0)
    assert log.take_token("k", 2, now=130.0)[0] and not log.take_token("k", 2, now=130.0)[0]
    assert not log.take_token("k", 2, now=50.0)[0]  # a host whose clock is behind refills nothing
    assert log.take_token("other", 2, now=130.0)[0]


def test_two_hosts_racing_on_one_key_spend_each_token_once(tmp_path):
    hosts = [EventLog(tmp_path / "online.db"), EventLog(tmp_path / "online.db")]
    allowed: list[bool] = []
    lock = threading.Lock()

    def spend(log: EventLog) -> None:
        for _ in range(15):
            ok = log.take_token("k", 10, now=1000.0)[0]  # one instant: no refill, so exactly 10 may pass
            with lock:
                allowed.append(ok)

    threads = [threading.Thread(target=spend, args=(hosts[i % 2],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(allowed) == 60 and sum(allowed) == 10


def test_revoking_a_key_marks_it_and_an_unknown_id_is_a_clear_error(tmp_path):
    log = EventLog(tmp_path / "online.db")
    key, rec = new_key("ana", 60, 4096)
    log.add_key(rec)
    assert log.revoke_key(rec.key_id).revoked
    assert log.key_by_hash(rec.key_hash).revoked
    with pytest.raises(ValueError, match="no API key 'key-nope'"):
        log.revoke_key("key-nope")
