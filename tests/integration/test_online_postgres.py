"""The online event log on a real PostgreSQL server: a cluster started by the test in a temporary directory (as
a non-root user), and two `flywheel serve` hosts sharing it — a completion served by one takes feedback through
the other, and each sees the other's deploys. Skipped only when the PostgreSQL binaries are not installed
(`make test` installs Debian's `postgresql`)."""

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest

from flywheel.online.deploy import deployed_version
from flywheel.online.events import CompletionRecord, EventLog, FeedbackRecord
from flywheel.online.keys import new_key
from flywheel.online.serve_process import ServerProcess, build_policy


def _pg_bin() -> Path | None:
    found = shutil.which("initdb") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))), None)
    return Path(found).resolve().parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (initdb not found): apt-get install postgresql, or `make test`")
    root = os.geteuid() == 0
    if root:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and no 'postgres' user to run the server as (PostgreSQL refuses root)")
    data = Path(tempfile.mkdtemp(prefix="flywheel-pg-"))  # not under pytest's root-only tmp dirs

    def as_pg(*cmd):
        return ["runuser", "-u", "postgres", "--", *cmd] if root else list(cmd)

    if root:
        os.chown(data, user.pw_uid, user.pw_gid)
    port = _free_port()
    subprocess.run(as_pg(str(bindir / "initdb"), "-D", str(data / "db"), "-A", "trust", "-U", "flywheel"),
                   check=True, capture_output=True)
    subprocess.run(as_pg(str(bindir / "pg_ctl"), "-D", str(data / "db"), "-l", str(data / "log"), "-w", "-o",
                         f"-p {port} -k {data} -c listen_addresses=127.0.0.1", "start"),
                   check=True, capture_output=True)
    try:
        yield f"postgresql+psycopg://flywheel@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_pg(str(bindir / "pg_ctl"), "-D", str(data / "db"), "-m", "immediate", "stop"),
                       capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def test_event_log_round_trip_on_postgres(postgres_url):
    a, b = EventLog(postgres_url), EventLog(postgres_url)  # two hosts
    _, rec = new_key("ana", 60, 4096)
    a.add_key(rec)
    assert b.key_by_hash(rec.key_hash).key_id == rec.key_id
    a.record_completion(CompletionRecord("pg-c1", rec.key_id, "m", 0, [1, 2], [3, 4], [-0.5, -0.25], [0, 0],
                                         "stop", "x"))
    b.record_feedback(FeedbackRecord("pg-f1", "pg-c1", rec.key_id, "edit_kept", diff="+y"))
    rows = [(f, c) for f, c in a.feedback_after(0) if f.id == "pg-f1"]
    assert rows[0][1].token_ids == [3, 4] and rows[0][0].diff == "+y"
    a.append_event("deploy", 0, "initial")
    assert deployed_version(b.events(("deploy", "rollback"))) == 0


def test_two_servers_share_one_postgres_log(postgres_url, tmp_path_factory):
    model = build_policy(tmp_path_factory.mktemp("pg-policy") / "model")
    shared_store = ["--weights.store=" + str(tmp_path_factory.mktemp("pg-store")), "--online.learner.enabled=false",
                    "--online.serve.rate_limit=shared"]
    elog = EventLog(postgres_url)
    key, rec = new_key("both-hosts", 600, 1 << 16)
    elog.add_key(rec)
    one = ServerProcess(tmp_path_factory.mktemp("host1") / "run", model, shared_store, db_url=postgres_url)
    two = ServerProcess(tmp_path_factory.mktemp("host2") / "run", model, shared_store, db_url=postgres_url)
    try:
        c1 = openai.OpenAI(base_url=one.base_url, api_key=key, max_retries=0)
        c2 = openai.OpenAI(base_url=two.base_url, api_key=key, max_retries=0)
        r = c1.chat.completions.create(model="flywheel", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        fb = c2.post("/feedback", body={"completion_id": r.id, "signal": "accept"}, cast_to=httpx.Response)
        assert fb.json()["completion_id"] == r.id
        assert any(f.id == fb.json()["id"] for f, _ in elog.feedback_after(0))
        assert len(elog.events(("deploy",))) == 1  # the second host found version 0 deployed already
        elog.append_event("rollback", 0, "noop")  # nothing to pop: both keep serving version 0
        time.sleep(0.5)
        for srv in (one, two):
            assert srv.status(key)["weight_version"] == 0
        # one token bucket per key for both hosts: 4 requests a minute in all, not 4 on each
        slow, slow_rec = new_key("slow", 4, 1 << 16)
        elog.add_key(slow_rec)
        codes = [httpx.get(f"{srv.base_url}/models", headers={"Authorization": f"Bearer {slow}"}, timeout=30)
                 .status_code for srv in (one, two) * 4]
        assert sorted(codes) == [200] * 4 + [429] * 4, codes
    finally:
        one.kill()
        two.kill()
