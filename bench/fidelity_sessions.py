"""Sessions with planted facts for the fidelity benchmark, deterministic by seed: a
coding agent (paths, failing-test error codes, pinned versions, tickets, commits among
code-local noise), a customer-service conversation (order, user and payment ids, emails,
phones, UUIDs), and many customer conversations joined in a row. Every fact is planted
once, in one place (what the user said, the assistant's text, a tool call's arguments, or
only a tool's output), with its ground truth; a session then grows round by round.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from bench.fidelity_values import (
    ARGUMENT_KEYS,
    CODING_KINDS,
    CUSTOMER_KINDS,
    ValueFactory,
    catalog_item,
    code_line,
    customer_name,
    noise_name,
    passing_test_line,
)
from worker.compaction import TokenCounter, parse_message

SOURCES = ("user", "assistant", "tool_argument", "tool_output")
SHAPES = ("coding", "customer", "joined")
DECISION_SHARE = 0.4  # of episodes that pin a value
SLOTS_PER_EPISODE = 3
DEFERRED_SHARE = 0.15  # of requests answered only some episodes later
EPISODES_PER_CUSTOMER = 3  # in joined conversations

_SYSTEM = {
    "coding": "You are a coding agent in the user's repository. Read and edit files, run "
              "the tests, quote paths, error codes, versions and tickets exactly.",
    "customer": "You are a customer-service agent for an online shop. Authenticate the "
                "customer, look up orders and payments with the tools, and confirm before "
                "any change.",
}
_TOOLS = {"coding": ("read_file", "run_tests", "grep", "git_log"),
          "customer": ("get_order_details", "get_user_details", "list_payments", "refund")}


@dataclass(frozen=True)
class Fact:
    """One planted value and its ground truth: where and when it was said."""

    value: str
    kind: str
    source: str  # one of SOURCES
    round: int  # 0: the session as first compacted; k: its k-th growth
    seq: int  # the message's position in the stored session (1-based)
    ended_call: bool = False  # an error code that ended a tool call or a test run
    pinned: bool = False  # the value a decision pinned
    conversation: int = 0  # which customer's, in joined conversations


@dataclass(frozen=True)
class Request:
    """A user request, known by a value it names, and where it was asked and answered."""

    key: str
    round: int
    seq: int
    conversation: int
    answered_round: int | None
    answered_seq: int | None


@dataclass(frozen=True)
class PlantedSession:
    """A session's messages per round (0: the initial session, then each growth)."""

    name: str
    shape: str
    rounds: tuple[tuple[dict[str, Any], ...], ...]
    round_tokens: tuple[int, ...]
    facts: tuple[Fact, ...]
    requests: tuple[Request, ...]


@dataclass(frozen=True)
class _Plant:
    value: str
    kind: str
    source: str
    ended_call: bool = False
    pinned: bool = False


@dataclass(frozen=True)
class _Step:
    """One message to append, the facts in it, and the requests it asks or answers."""

    message: dict[str, Any]
    plants: tuple[_Plant, ...] = ()
    conversation: int = 0
    asks: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()


@dataclass
class _Builder:
    """The growing session: messages, facts and requests, round by round."""

    shape: str
    rng: random.Random
    counter: TokenCounter
    values: ValueFactory
    messages: list[dict[str, Any]] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    asked: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # round, seq, conv.
    answered: dict[str, tuple[int, int]] = field(default_factory=dict)
    deferred: dict[int, list[str]] = field(default_factory=dict)  # by the episode answering
    round: int = 0
    queue: deque[_Step] = field(default_factory=deque)
    slots: deque[tuple[str, str]] = field(default_factory=deque)
    episodes: int = 0

    @property
    def kinds(self) -> tuple[str, ...]:
        return CODING_KINDS if self.shape == "coding" else CUSTOMER_KINDS

    @property
    def conversation(self) -> int:
        return (self.episodes - 1) // EPISODES_PER_CUSTOMER if self.shape == "joined" else 0

    def add(self, step: _Step) -> int:
        """Append the step's message; return its tokens."""
        self.messages.append(step.message)
        seq = len(self.messages)
        self.facts.extend(Fact(p.value, p.kind, p.source, self.round, seq, p.ended_call,
                               p.pinned, step.conversation) for p in step.plants)
        self.asked.update((key, (self.round, seq, step.conversation)) for key in step.asks)
        self.answered.update((key, (self.round, seq)) for key in step.answers)
        return self.counter.count_message(parse_message(step.message))

    def fill(self, target_tokens: int) -> int:
        """Append steps until ``target_tokens`` are reached and a user request ends the
        round (its answer opens the next round); return the tokens added."""
        tokens = 0
        while True:
            if not self.queue:
                self.queue.extend(_episode(self))
            step = self.queue.popleft()
            tokens += self.add(step)
            if tokens >= target_tokens and step.asks:
                return tokens

    def draw_slots(self, count: int) -> list[tuple[str, str]]:
        """The next (kind, source) pairs: every pair once per shuffled cycle."""
        drawn = []
        for _ in range(count):
            if not self.slots:
                cycle = [(kind, source) for kind in self.kinds for source in SOURCES]
                self.rng.shuffle(cycle)
                self.slots.extend(cycle)
            drawn.append(self.slots.popleft())
        return drawn

    def plant(self, kind: str, source: str, **flags: bool) -> _Plant:
        return _Plant(self.values.new(kind), kind, source, **flags)


def generate_session(shape: str, tokens: int, *, rounds: int, growth_ratio: float,
                     seed: int, counter: TokenCounter) -> PlantedSession:
    """A ``shape`` session of about ``tokens`` tokens, then ``rounds`` growths of
    ``growth_ratio`` times ``tokens`` each."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
    rng = random.Random(f"{shape}-{tokens}-{seed}")
    builder = _Builder(shape, rng, counter, ValueFactory(rng))
    system = {"role": "system", "content": _SYSTEM["coding" if shape == "coding" else "customer"]}
    round_tokens = [builder.add(_Step(system)) + builder.fill(tokens)]
    bounds = [len(builder.messages)]
    for number in range(1, rounds + 1):
        builder.round = number
        round_tokens.append(builder.fill(int(tokens * growth_ratio)))
        bounds.append(len(builder.messages))
    starts = [0, *bounds[:-1]]
    requests = tuple(Request(key, *asked, *builder.answered.get(key, (None, None)))
                     for key, asked in builder.asked.items())
    return PlantedSession(
        name=f"{shape}-{tokens // 1000}k", shape=shape,
        rounds=tuple(tuple(builder.messages[a:b]) for a, b in zip(starts, bounds, strict=True)),
        round_tokens=tuple(round_tokens), facts=tuple(builder.facts), requests=requests)


# --- episodes: a request, the tool work, the answer ------------------------------------

def _episode(b: _Builder) -> Iterator[_Step]:
    b.episodes += 1
    opening = b.shape == "joined" and b.episodes % EPISODES_PER_CUSTOMER == 1
    if opening and b.episodes > 1:
        yield _Step({"role": "user", "content": "That's all for today, thanks."})
        yield _Step({"role": "assistant", "content": "Glad I could help. Goodbye!"})
    slots = b.draw_slots(SLOTS_PER_EPISODE)
    decision = _decision(b)
    ask = _user_turn(b, slots, decision, opening)
    yield ask
    yield from _tool_work(b, slots, decision, ask.asks[0])


def _user_turn(b: _Builder, slots: list[tuple[str, str]], decision: _Plant | None,
               opening: bool) -> _Step:
    said = [b.plant(b.rng.choice(b.kinds), "user")]  # every request names something
    said += [b.plant(kind, source) for kind, source in slots if source == "user"]
    pinned = [decision] if decision and decision.source == "user" else []
    greets = opening or (b.episodes == 1 and b.shape == "customer")
    request = (f"Hi, I'm {customer_name(b.rng)}. " if greets else "") + _request_text(
        b, said, pinned)
    asks = [said[0].value]
    if b.rng.random() < DEFERRED_SHARE:
        # Not a fact: a request only, answered some episodes later, maybe rounds later.
        later = b.values.new(b.rng.choice(b.kinds))
        request += f" Also, when you have a moment, check {later}."
        b.deferred.setdefault(b.episodes + b.rng.randint(2, 8), []).append(later)
        asks.append(later)
    return _Step({"role": "user", "content": request}, (*said, *pinned), b.conversation,
                 asks=tuple(asks))


def _tool_work(b: _Builder, slots: list[tuple[str, str]], decision: _Plant | None,
               key: str) -> Iterator[_Step]:
    """One tool call, its output, and the answer (with any deferred follow-ups)."""
    call_id = f"call_{b.episodes:05d}"
    arguments = [b.plant(kind, source) for kind, source in slots if source == "tool_argument"]
    outputs = [b.plant(kind, source, ended_call=kind == "error")
               for kind, source in slots if source == "tool_output"]
    spoken = [b.plant(kind, source) for kind, source in slots if source == "assistant"]
    tool = b.rng.choice(_TOOLS["coding" if b.shape == "coding" else "customer"])
    if tool == "run_tests" and not any(plant.kind == "error" for plant in outputs):
        outputs.append(b.plant("error", "tool_output", ended_call=True))  # the test failed
    before, after = spoken[: len(spoken) // 2], spoken[len(spoken) // 2:]
    yield _Step(_tool_call(call_id, tool, arguments, _assistant_text("Let me check", before, b)),
                (*arguments, *before), b.conversation)
    yield _Step({"role": "tool", "tool_call_id": call_id, "name": tool,
                 "content": _tool_output(b, outputs)}, tuple(outputs), b.conversation)
    closing = [decision] if decision and decision.source == "assistant" else []
    reply = _assistant_text("Done. I looked at", after, b) + _decision_text(closing)
    followed_up = b.deferred.pop(b.episodes, [])
    reply += "".join(f" Following up on {later}: that is done now." for later in followed_up)
    yield _Step({"role": "assistant", "content": reply}, (*after, *closing), b.conversation,
                answers=(key, *followed_up))


def _decision(b: _Builder) -> _Plant | None:
    if b.rng.random() >= DECISION_SHARE:
        return None
    kind = "version" if b.shape == "coding" else "payment_id"
    return b.plant(kind, "user" if b.rng.random() < 0.25 else "assistant", pinned=True)


def _phrase(b: _Builder, plant: _Plant) -> str:
    return b.values.phrase(plant.kind, plant.value)


def _request_text(b: _Builder, said: list[_Plant], pinned: list[_Plant]) -> str:
    asks = ("Can you look into {}?", "Could you help me with {}?", "Please check {}.")
    text = b.rng.choice(asks).format(", ".join(_phrase(b, p) for p in said))
    if pinned:
        text += f" We decided to keep {pinned[0].value}; do not change it."
    return text


def _assistant_text(lead: str, plants: list[_Plant], b: _Builder) -> str:
    if not plants:
        return b.rng.choice(("Let me look.", "Checking now.", "One moment."))
    return f"{lead} {', '.join(_phrase(b, p) for p in plants)}."


def _decision_text(plants: list[_Plant]) -> str:
    if not plants:
        return ""
    value = plants[0].value
    if plants[0].kind == "version":
        return f" Decision: we pin {value} and keep it."
    return f" Confirmed: the refund goes to {value}."


def _tool_call(call_id: str, tool: str, plants: list[_Plant], text: str) -> dict[str, Any]:
    arguments: dict[str, object] = {**_fields(plants)} or {"limit": 50}
    return {"role": "assistant", "content": text, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": tool, "arguments": json.dumps(arguments)}}]}


def _tool_output(b: _Builder, plants: list[_Plant]) -> str:
    errors = [p for p in plants if p.kind == "error"]
    others = [p for p in plants if p.kind != "error"]
    if b.shape != "coding":
        return _order_lookup(b, others)
    lines = [(code_line if b.rng.random() < 0.6 else passing_test_line)(b.rng)
             for _ in range(b.rng.randint(60, 240))]
    for plant in others:
        lines.insert(b.rng.randrange(len(lines)), f"    # see {_phrase(b, plant)}")
    for plant in errors:
        if b.rng.random() < 0.5:
            lines.insert(0, f"Error: {plant.value} while running {noise_name(b.rng)}")
        else:
            lines.append(f"FAILED tests/test_{noise_name(b.rng)}.py::test_sync - {plant.value}")
    return "\n".join(lines)


def _order_lookup(b: _Builder, plants: list[_Plant]) -> str:
    record: dict[str, Any] = dict(_fields(plants))
    record["status"] = b.rng.choice(("pending", "delivered", "processed", "cancelled"))
    record["items"] = [catalog_item(b.rng) for _ in range(b.rng.randint(12, 40))]
    return json.dumps(record)



def _fields(plants: list[_Plant]) -> dict[str, str]:
    """Tool-call or record fields holding the values (a repeated kind gets ``key_2``)."""
    fields: dict[str, str] = {}
    for plant in plants:
        key = ARGUMENT_KEYS[plant.kind]
        fields[key if key not in fields else f"{key}_{len(fields) + 1}"] = plant.value
    return fields
