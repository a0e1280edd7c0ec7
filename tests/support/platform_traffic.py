"""A platform's appenders for the concurrency test: threads sharing one ``SessionsAPI`` or
processes opening their own, racing to answer each session's open tool call, then
appending whole exchanges. Importable by a spawned process (no pytest, no fixtures)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from threading import Barrier
from typing import Any

from tests.support.generated import generated_turns
from worker.platform.sessions import MessagesRejected, SessionsAPI


@dataclass(frozen=True)
class AppendAttempt:
    """One append as sent, and what came of it (``seqs`` empty: rejected)."""

    session_id: str
    bodies: tuple[dict[str, Any], ...]
    seqs: tuple[int, ...]
    rejected_kinds: tuple[str, ...] = ()
    is_answer: bool = False


def open_call_id(session_id: str) -> str:
    return f"call_open_{session_id}"


def answer(session_id: str, tag: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": open_call_id(session_id),
            "content": f'{{"answered_by": "{tag}"}}'}


def run_appender(
    url: str, tag: str, session_ids: list[str], batches: int, barrier: Barrier,
    sessions: SessionsAPI | None = None, *, pause_s: float = 0.0,
) -> list[AppendAttempt]:
    """Race the other appenders to answer every session's open call, wait for all of them,
    then append ``batches`` exchanges spread over the sessions, ``pause_s`` apart. Opens
    its own store unless given one (the threads' shared store)."""
    store = sessions or SessionsAPI.open(url)
    try:
        barrier.wait()
        attempts = [attempt(store, sid, [answer(sid, tag)], is_answer=True)
                    for sid in session_ids]
        # An exchange appended before every racer tried would close the call itself.
        barrier.wait()
        for batch in range(batches):
            if batch:
                time.sleep(pause_s)
            session_id = session_ids[(batch + len(tag)) % len(session_ids)]
            attempts.append(attempt(store, session_id, generated_turns(f"{tag}B{batch}", 1)))
        return attempts
    finally:
        if sessions is None:
            store.close()


def attempt(store: SessionsAPI, session_id: str, bodies: list[dict[str, Any]], *,
            is_answer: bool = False) -> AppendAttempt:
    try:
        appended = store.append(session_id, bodies)
    except MessagesRejected as rejected:
        kinds = tuple(problem.kind.value for problem in rejected.problems)
        return AppendAttempt(session_id, tuple(bodies), (), kinds, is_answer)
    assert appended.problems == (), appended.problems
    return AppendAttempt(session_id, tuple(bodies), appended.seqs, (), is_answer)
