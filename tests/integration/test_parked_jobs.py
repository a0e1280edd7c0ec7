"""The store's parked jobs (migration 0007, ``db/parked.py``) on SQLite and PostgreSQL:
parking ends the job in one transaction (run row, lease and queue marker released), a
session holds one parked job at most, the poller's marks and answers accumulate, and
erasing the session erases its parked job."""

from __future__ import annotations

from datetime import timedelta

from db import ParkedJob, Store
from tests.integration.test_store import T0, conversation, job_run
from tests.support.store_jobs import take_lease


def park_of(session_id: str, keys: list[str], *, head_seq: int = 5) -> ParkedJob:
    requests = [{"custom_id": key, "messages": [{"role": "user", "content": key}],
                 "max_output_tokens": 64} for key in keys]
    return ParkedJob(session_id, None, head_seq, "open", requests, None, {}, T0)


def test_parking_records_the_run_releases_the_lease_and_replaces_an_earlier_park(
        store: Store) -> None:
    store.import_session("s1", {}, conversation(5), T0)
    assert take_lease(store, "s1", "w:task-1", 60, T0)

    store.park_job(job_run("s1", "parked"), park_of("s1", ["a", "b"]), lease_owner="w:task-1")
    assert take_lease(store, "s1", "w:task-2", 60, T0)  # the lease is free again
    store.park_job(job_run("s1", "parked"), park_of("s1", ["c"], head_seq=5),
                   lease_owner="w:task-2")

    parks = store.parked_jobs(session_id="s1")
    assert [[r["custom_id"] for r in park.requests] for park in parks] == [["c"]]
    assert parks[0].state == "open" and parks[0].revision_id is None
    assert [run.outcome for run in store.runs(session_id="s1")] == ["parked", "parked"]
    assert store.get_session("s1").lease_owner is None


def test_the_poller_marks_submitted_parks_and_their_answers_accumulate(store: Store) -> None:
    for session_id in ("s1", "s2", "s3"):
        store.import_session(session_id, {}, conversation(5, prefix=session_id), T0)
        store.park_job(job_run(session_id, "parked"), park_of(session_id, [f"{session_id}k"]),
                       lease_owner="nobody")

    store.mark_parks_submitted(["s1", "s2"], "batch-1")
    store.add_park_answers({"s1": {"s1k": {"response": {"status_code": 200}}}})
    store.add_park_answers({"s1": {"s1k2": {"error": {"code": "batch_expired"}}}})

    assert [p.session_id for p in store.parked_jobs(state="open")] == ["s3"]
    assert [p.session_id for p in store.parked_jobs(batch_id="batch-1")] == ["s1", "s2"]
    (answered,) = store.parked_jobs(state="answered")
    assert answered.session_id == "s1" and set(answered.answers) == {"s1k", "s1k2"}
    assert store.drop_parked_job("s2") and not store.drop_parked_job("s2")
    store.delete_session("s1", force=True, now=T0 + timedelta(days=1))
    assert [p.session_id for p in store.parked_jobs()] == ["s3"]
