"""Sessions the tests generate themselves (never the corpus): exchanges of a user ask, a
tool call with its result and the agent's answer, each with identifiers unique to a tag.
No service, no Celery: the unit suite imports this."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


def generated_turns(tag: str, count: int) -> list[dict[str, Any]]:
    """``count`` exchanges of user ask, tool call with its result, and answer, each
    carrying identifiers unique to ``tag`` (reservation ``{tag}R{i}``)."""
    messages: list[dict[str, Any]] = []
    for i in range(count):
        reservation, call_id = f"{tag}R{i}", f"call_{tag}_{i}"
        arguments = f'{{"reservation_id": "{reservation}"}}'
        messages += [
            {"role": "user", "content": f"Please check reservation {reservation} and tell me "
             f"whether flight HAT{100 + i} on 2024-05-{10 + i % 20} still has seats."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {
                    "name": "get_reservation_details", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": (
                f'{{"reservation_id": "{reservation}", "flight": "HAT{100 + i}", '
                f'"seats_left": {i % 7}, "cabin": "economy", "status": "confirmed"}}')},
            {"role": "assistant", "content": f"Reservation {reservation} is confirmed on "
             f"HAT{100 + i}; {i % 7} economy seats are left. I have noted your request."},
        ]
    return messages


def generated_session(session_id: str, turns: int) -> dict[str, Any]:
    """A session record: a system prompt and ``turns`` generated exchanges."""
    system = {"role": "system", "content": "You are an airline agent. Follow the policy."}
    return {"session_id": session_id, "messages": [system, *generated_turns(session_id, turns)]}


# The user's situation, drawn from a seeded grammar: invented place names, products and
# wordings, so a rule written for one list of phrases fails it.
_SYLLABLES = ("ka", "lo", "mer", "vin", "da", "tor", "sel", "ru", "bar", "ne", "qui", "zan")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_FACT_FORMS: dict[str, tuple[str, ...]] = {
    "where": (
        "Also, I'm currently traveling abroad in {place}.",
        "Right now I am staying with family in {place}.",
        "We moved to {place} {count} weeks ago.",
        "For the next {count} days I'm on a trip to {place}.",
        "I live near {place}, so the local store is closed.",
    ),
    "device_or_plan": (
        "I'm only using mobile data right now.",
        "My phone is a {brand} {model}.",
        "I'm on the {brand} {tier} plan.",
        "The laptop here runs {brand}OS {count}.",
        "Our subscription is the {tier} tier with {count} seats.",
        "Everything goes through my {brand} router.",
    ),
    "deadline": (
        "I need it sorted by {day}.",
        "The deadline for the claim is {day} at noon.",
        "It has to arrive before {day}.",
        "My flight leaves in {count} days.",
        "Whatever you do has to be done within {count} hours.",
    ),
    "preference": (
        "I'd rather get store credit than a refund.",
        "Please don't call me, email only.",
        "I prefer the {tier} option over anything else.",
        "I'm allergic to {food}, so nothing with it.",
        "Never ship it to the {place} office.",
    ),
}
_OPENERS = (
    "Hi, I need help with order {code}.",
    "Hello, my {thing} stopped working yesterday.",
    "I'd like to change booking {code}.",
    "Can you look at ticket {code} for me.",
    "Something is wrong with my {thing}.",
)
_FILLERS = (
    "It is really annoying.",
    "I tried restarting it twice.",
    "Thanks for looking into this.",
    "The same thing happened to a friend.",
    "Sorry for the long message.",
)


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(syllables)).capitalize()


def _fill(rng: random.Random, form: str) -> str:
    return form.format(
        place=_word(rng, rng.randint(2, 3)), brand=_word(rng, 2), tier=_word(rng, 2).lower(),
        model=f"{rng.choice('XSQ')}{rng.randint(2, 30)}", count=rng.randint(2, 40),
        day=rng.choice(_DAYS), food=_word(rng, 2).lower(), thing=_word(rng, 2).lower(),
        code=f"#{rng.choice('WQK')}{rng.randint(1_000_000, 9_999_999)}")


@dataclass(frozen=True)
class FactTurn:
    """A user's turn of several sentences whose decisive fact is a later one."""

    text: str
    fact: str
    kind: str


def fact_turn(rng: random.Random) -> FactTurn:
    """An opener, zero to three fillers, then the decisive fact (or it between fillers)."""
    kind = rng.choice(sorted(_FACT_FORMS))
    fact = _fill(rng, rng.choice(_FACT_FORMS[kind]))
    fillers = [_fill(rng, form) for form in rng.sample(_FILLERS, rng.randint(0, 3))]
    at = rng.randint(0, len(fillers))
    sentences = [_fill(rng, rng.choice(_OPENERS)), *fillers[:at], fact, *fillers[at:]]
    return FactTurn(" ".join(sentences), fact, kind)


def fact_session(seed: int, turns: int) -> tuple[list[dict[str, Any]], list[FactTurn]]:
    """A system prompt and ``turns`` exchanges whose user turn carries a decisive later
    fact, then a look-up, its result and the agent's reply; with the turns planted."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a support agent. Follow the policy."}]
    planted: list[FactTurn] = []
    for index in range(turns):
        turn = fact_turn(rng)
        planted.append(turn)
        call_id, case = f"call_{seed}_{index}", f"S{seed}C{index}"
        messages += [
            {"role": "user", "content": turn.text},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {
                    "name": "lookup_account", "arguments": f'{{"case_id": "{case}"}}'}}]},
            {"role": "tool", "tool_call_id": call_id, "content": '{"status": "ok"}'},
            {"role": "assistant", "content": f"I have checked case {case}; one moment."},
        ]
    return messages, planted


# Joined sessions: each party after the first starts by one general signal, in a wording
# drawn from its family.
PARTY_SIGNALS = ("boundary", "greeting_after_closing", "new_identity")
_BOUNDARIES = ("[SESSION BOUNDARY {n}/{total}] The previous customer conversation has ended.",
               "--- New conversation ---", "New customer from the queue.",
               "Next task: a different request follows.")
_CLOSINGS = ("Have a wonderful day!", "Glad I could help. Goodbye!",
             "That is all set; take care.", "Thanks for contacting us, bye!")
_GREETINGS = ("Hi", "Hello there", "Good morning", "Hey")
_ASKS = ("I need help with order {code}.", "I would like to change booking {code}.",
         "Please look at ticket {code} for me.")


@dataclass(frozen=True)
class PlantedParty:
    """One party of a joined session: its first message's index, the signal that started
    it, who the user said they were, the fact and decision said in it, its request."""

    first_index: int
    signal: str
    identity: str
    fact: str
    decision: str
    ask: str
    failed_call: str = ""


def joined_session(seed: int, parties: int) -> tuple[list[dict[str, Any]], list[PlantedParty]]:
    """A system prompt and ``parties`` conversations joined in one session, each with a
    user turn whose later sentence is a fact, a look-up (some failing, never retried), an
    answer with a decision; the parties after the first start by a drawn signal."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a support agent. Follow the policy."}]
    planted: list[PlantedParty] = []
    signals = ["first", *(rng.choice(PARTY_SIGNALS) for _ in range(parties - 1)), "end"]
    for index, signal in enumerate(signals[:-1]):
        if signal == "boundary":
            messages.append({"role": "user", "content": rng.choice(_BOUNDARIES).format(
                n=index + 1, total=parties)})
        identity = f"{_word(rng, 2).lower()}_{_word(rng, 1).lower()}_{rng.randint(1000, 9999)}"
        ask = _fill(rng, rng.choice(_ASKS))
        greeting = (f"{rng.choice(_GREETINGS)}! "
                    if signal in ("first", "greeting_after_closing") else "")
        turn = fact_turn(rng)
        first = len(messages)
        messages.append({"role": "user", "content": f"{greeting}{ask} My user id is "
                         f"{identity}. {turn.fact}"})
        call_id, failing = f"call_{seed}_{index}", rng.random() < 0.5
        result = (f"Error: account {identity} is locked (E{rng.randint(100, 999)})" if failing
                  else '{"status": "ok"}')
        decision = f"We'll go with the {_word(rng, 2).lower()} option."
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {
                    "name": "update_account", "arguments": f'{{"user_id": "{identity}"}}'}}]},
            {"role": "tool", "tool_call_id": call_id, "content": result},
            {"role": "assistant", "content": f"I looked at your account. {decision}"},
        ]
        planted.append(PlantedParty(first, signal, identity, turn.fact, decision, ask,
                                    call_id if failing else ""))
        if signals[index + 1] == "greeting_after_closing" or (
                signals[index + 1] != "end" and rng.random() < 0.5):
            messages.append({"role": "assistant", "content": rng.choice(_CLOSINGS)})
    return messages, planted


@dataclass(frozen=True)
class LabelledNumber:
    """A bare number as a text gives it: the value, the label word, the name beside it."""

    value: str
    label: str
    name: str
    text: str


def labelled_number(rng: random.Random) -> LabelledNumber:
    """A 9-12 digit number in one of the ways texts label one, with invented words."""
    digits = rng.randint(9, 12)
    value = str(rng.randint(10 ** (digits - 1), 10 ** digits - 1))
    word, name = _word(rng, 2).lower(), _word(rng, rng.randint(1, 2))
    form = rng.randrange(5)
    if form == 0:
        return LabelledNumber(value, word, "", f"I looked at the {word} {value} for you.")
    if form == 1:
        return LabelledNumber(value, f"{word} number", "",
                              f"My {word} number is {value}, thanks.")
    if form == 2:
        return LabelledNumber(value, f"{word}_id", name, f'{{"items": [{{"{word}_id": '
                              f'"{value}", "name": "{name}", "price": {rng.randint(1, 99)}}}]}}')
    if form == 3:
        return LabelledNumber(value, word, name, f"Swap {word} {value} ({name}) please.")
    return LabelledNumber(value, f"{word}_ref", "", f"{word}_ref={value} status=open")
