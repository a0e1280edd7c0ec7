"""The demo's built-in sessions: tool-heavy coding-agent sessions of varied lengths, made
deterministically from a seed (no file, no network). Each is a session record as
`compactor import` reads it: ``{"session_id", "source", "messages": [...]}``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

SOURCE = "compactor demo generator"
# Every LONG_EVERY-th session is long (well over the demo's trigger); the others are
# short or medium, so the demo shows sessions that are due next to ones that are not.
LONG_EVERY = 4
LONG_TURNS = (14, 20)
SHORT_TURNS = (1, 4)

SYSTEM_PROMPT = (
    "You are a senior software engineer working in the {repo} repository ({language}). "
    "You can read and edit files, run tests and commands, search the code, read tickets "
    "and query service logs through tools. Prefer small, reviewed changes; run the tests "
    "after every edit; never push to main; quote file paths, ticket ids and versions "
    "exactly. The on-call rota and deploys are owned by the platform team."
)


@dataclass(frozen=True)
class Project:
    """A repository the agent works in, with the names its tool outputs mention."""

    repo: str
    language: str
    service: str
    ticket_prefix: str
    modules: tuple[str, ...]
    library: str


PROJECTS = (
    Project("billing-api", "Python 3.11, FastAPI", "billing", "PAY",
            ("invoices", "ledger", "refunds", "webhooks", "currency"), "stripe"),
    Project("ingest-pipeline", "Python 3.12, Celery", "ingest", "DATA",
            ("parsers", "dedup", "s3_sink", "schema_registry", "backfill"), "pyarrow"),
    Project("web-dashboard", "Python 3.11, Django", "dashboard", "WEB",
            ("reports", "auth", "exports", "widgets", "permissions"), "django"),
    Project("search-service", "Python 3.11, aiohttp", "search", "SRCH",
            ("indexer", "ranking", "synonyms", "query_parser", "shards"), "elasticsearch"),
)
ERROR_CODES = ("E1042", "E2210", "ERR_LEDGER_409", "ERR_TIMEOUT_504", "E3307", "ERR_SCHEMA_422")
LEVELS = ("INFO", "INFO", "INFO", "WARN", "ERROR")


@dataclass
class _Context:
    """The random source and the names one session keeps coming back to."""

    rng: random.Random
    project: Project
    call_count: int = 0
    tickets: list[str] = field(default_factory=list)

    def pick(self, options: tuple[str, ...] | list[str]) -> str:
        return options[self.rng.randrange(len(options))]

    def path(self) -> str:
        module = self.pick(self.project.modules)
        kind = self.pick(("service", "models", "api", "tasks", "utils"))
        return f"src/{self.project.repo.replace('-', '_')}/{module}/{kind}.py"

    def test_path(self) -> str:
        kind = self.pick(("flow", "api", "edge"))
        return f"tests/{self.pick(self.project.modules)}/test_{kind}.py"

    def ticket(self) -> str:
        ticket = f"{self.project.ticket_prefix}-{self.rng.randint(1000, 4999)}"
        self.tickets.append(ticket)
        return ticket

    def version(self) -> str:
        return f"{self.rng.randint(1, 9)}.{self.rng.randint(0, 40)}.{self.rng.randint(0, 15)}"

    def sha(self) -> str:
        return f"{self.rng.getrandbits(28):07x}"

    def call_id(self) -> str:
        self.call_count += 1
        return f"call_{self.rng.getrandbits(48):012x}{self.call_count:03d}"


# --- tool outputs: each takes the context and returns (arguments, output) ---------------

def _read_file(ctx: _Context) -> tuple[dict[str, Any], str]:
    path = ctx.path()
    lines = [f'"""{ctx.project.service}: {path.rsplit("/", 2)[-2]} logic."""', "",
             "from __future__ import annotations", "", "import logging",
             f"from {ctx.project.library} import Client", "",
             f'API_VERSION = "{ctx.version()}"', f"RETRY_LIMIT = {ctx.rng.randint(2, 8)}", ""]
    for _ in range(ctx.rng.randint(4, 9)):
        name = ctx.pick(("load", "apply", "reconcile", "validate", "emit", "merge")) + "_" + \
            ctx.pick(("batch", "entry", "record", "window", "event", "totals"))
        lines += [f"def {name}(items: list[dict], *, limit: int = {ctx.rng.randint(10, 500)}) "
                  "-> list[dict]:",
                  f'    """{name.replace("_", " ").capitalize()} for the {ctx.project.service} '
                  'service."""',
                  "    result = []", "    for item in items[:limit]:",
                  f'        if item.get("status") == "{ctx.pick(("failed", "pending", "void"))}":',
                  f'            logging.warning("skipping %s ({ctx.pick(ERROR_CODES)})", '
                  'item["id"])', "            continue",
                  "        result.append(item)", "    return result", ""]
    return {"path": path}, "\n".join(f"{n:>4}  {text}" for n, text in enumerate(lines, 1))


def _run_tests(ctx: _Context) -> tuple[dict[str, Any], str]:
    target, code = ctx.test_path(), ctx.pick(ERROR_CODES)
    passed, failed = ctx.rng.randint(20, 180), ctx.rng.randint(0, 3)
    out = ["============ test session starts ============ platform linux -- Python 3.11.9",
           f"collected {passed + failed} items", ""]
    for n in range(failed):
        line = ctx.rng.randint(20, 300)
        out += [f"___ test_{ctx.pick(ctx.project.modules)}_{n} ___", f"{target}:{line}: in test",
                "    assert response.status_code == 200, response.json()",
                f"E   AssertionError: {{'error': '{code}', 'detail': 'upstream rejected batch'}}",
                "E   assert 409 == 200", f"{ctx.path()}:{ctx.rng.randint(10, 90)}: {code}", ""]
    out.append(f"==== {failed} failed, {passed} passed in {ctx.rng.uniform(2, 40):.2f}s ====")
    return {"target": target, "flags": ["-x", "-q"]}, "\n".join(out)


def _grep(ctx: _Context) -> tuple[dict[str, Any], str]:
    pattern = ctx.pick(("RETRY_LIMIT", "API_VERSION", "reconcile_", "Client(", "status ==",
                        *ERROR_CODES))
    hits = [f"{ctx.path()}:{ctx.rng.randint(5, 400)}:    {pattern} = ..." for _ in
            range(ctx.rng.randint(3, 14))]
    return {"pattern": pattern, "path": "src/"}, "\n".join(hits)


def _git_log(ctx: _Context) -> tuple[dict[str, Any], str]:
    entries = [f"{ctx.sha()} {ctx.pick(('fix', 'feat', 'chore', 'refactor'))}"
               f"({ctx.pick(ctx.project.modules)}): {ctx.pick(('handle', 'retry', 'bump', 'log'))}"
               f" {ctx.pick(('timeouts', 'duplicates', 'currency rounding', 'schema drift'))} "
               f"[{ctx.ticket()}]" for _ in range(ctx.rng.randint(6, 15))]
    return {"command": "git log --oneline -n 15"}, "\n".join(entries)


def _get_ticket(ctx: _Context) -> tuple[dict[str, Any], str]:
    ticket = ctx.pick(ctx.tickets) if ctx.tickets else ctx.ticket()
    body = {"id": ticket, "status": ctx.pick(("open", "in_progress", "triaged")),
            "priority": ctx.pick(("P1", "P2", "P3")), "service": ctx.project.service,
            "affected_version": ctx.version(), "error_code": ctx.pick(ERROR_CODES),
            "reporter": ctx.pick(("support-bot", "j.alvarez", "m.chen", "oncall")),
            "comments": [{"author": ctx.pick(("m.chen", "a.okafor", "s.ito")),
                          "text": f"Seen again on shard {ctx.rng.randint(1, 12)} after deploy "
                                  f"{ctx.sha()}; {ctx.rng.randint(3, 900)} requests affected."}
                         for _ in range(ctx.rng.randint(1, 4))]}
    return {"ticket_id": ticket}, json.dumps(body, indent=2)


def _query_logs(ctx: _Context) -> tuple[dict[str, Any], str]:
    rows = []
    for n in range(ctx.rng.randint(8, 24)):
        level = ctx.pick(LEVELS)
        rows.append(json.dumps({
            "ts": f"2024-11-{ctx.rng.randint(10, 28):02d}T{n % 24:02d}:{ctx.rng.randint(0, 59):02d}"
                  f":{ctx.rng.randint(0, 59):02d}Z", "level": level,
            "service": ctx.project.service, "request_id": f"req-{ctx.rng.getrandbits(40):010x}",
            "latency_ms": ctx.rng.randint(3, 5000),
            "error": ctx.pick(ERROR_CODES) if level == "ERROR" else None}))
    return {"service": ctx.project.service, "since": "24h", "level": "WARN"}, "\n".join(rows)


def _edit_file(ctx: _Context) -> tuple[dict[str, Any], str]:
    path = ctx.path()
    added, removed = ctx.rng.randint(1, 30), ctx.rng.randint(0, 12)
    return ({"path": path, "patch": f"@@ -{ctx.rng.randint(1, 200)},7 +{ctx.rng.randint(1, 200)},9"
             f" @@\n-RETRY_LIMIT = 3\n+RETRY_LIMIT = {ctx.rng.randint(4, 8)}"},
            f"Applied patch to {path}: 1 hunk, +{added} -{removed} lines")


Tool = Callable[[_Context], tuple[dict[str, Any], str]]
TOOLS: dict[str, Tool] = {"read_file": _read_file, "run_tests": _run_tests, "grep": _grep,
                          "git_log": _git_log, "get_ticket": _get_ticket,
                          "query_logs": _query_logs, "edit_file": _edit_file}

REQUESTS = (
    "Tests in {test} started failing after we bumped {library} to {version}. Find out why "
    "and fix it.",
    "Customers report {code} errors from the {service} service since the {version} deploy "
    "({ticket}). Investigate the logs and propose a fix.",
    "Add a dry-run option to {path}; keep the public API unchanged and add tests.",
    "Summarize what changed in the last commits touching {path} and whether {ticket} is fixed.",
    "Raise RETRY_LIMIT in {path} and check nothing else depends on the old value.",
)


# --- sessions -----------------------------------------------------------------------

def generate_sessions(count: int, seed: int) -> Iterator[dict[str, Any]]:
    """Yield ``count`` session records; the same seed always gives the same sessions."""
    for index in range(count):
        rng = random.Random(f"compactor-demo:{seed}:{index}")
        # Shifted every LONG_EVERY sessions, so the long ones are not all one project.
        project = PROJECTS[(index + index // LONG_EVERY) % len(PROJECTS)]
        turns = rng.randint(*(LONG_TURNS if index % LONG_EVERY == 0 else SHORT_TURNS))
        yield {"session_id": f"demo-s{seed}-{index + 1:02d}-{project.repo}", "source": SOURCE,
               "messages": _session_messages(_Context(rng, project), turns)}


def _session_messages(ctx: _Context, turns: int) -> list[dict[str, Any]]:
    project = ctx.project
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT.format(
        repo=project.repo, language=project.language)}]
    for _ in range(turns):
        messages.append({"role": "user", "content": _request(ctx)})
        for _ in range(ctx.rng.randint(2, 5)):
            messages += _tool_round(ctx)
        messages.append({"role": "assistant", "content": _answer(ctx)})
    return messages


def _request(ctx: _Context) -> str:
    return ctx.pick(REQUESTS).format(
        test=ctx.test_path(), library=ctx.project.library, version=ctx.version(),
        code=ctx.pick(ERROR_CODES), service=ctx.project.service, ticket=ctx.ticket(),
        path=ctx.path())


def _tool_round(ctx: _Context) -> list[dict[str, Any]]:
    """One assistant message with one to three (parallel) tool calls, then their results."""
    names = ctx.rng.sample(sorted(TOOLS), k=ctx.rng.choice((1, 1, 2, 3)))
    calls, results = [], []
    for name in names:
        arguments, output = TOOLS[name](ctx)
        call_id = ctx.call_id()
        calls.append({"id": call_id, "type": "function",
                      "function": {"name": name, "arguments": json.dumps(arguments)}})
        results.append({"role": "tool", "tool_call_id": call_id, "name": name,
                        "content": output})
    return [{"role": "assistant", "content": _plan(ctx, names), "tool_calls": calls}, *results]


def _plan(ctx: _Context, names: list[str]) -> str:
    """The assistant's one-line reason for its next tool calls."""
    lead = ctx.pick(("The traceback points at the retry path", "The ticket mentions a deploy",
                     "That narrows it down", "The logs show a spike of errors",
                     "Before editing anything"))
    how = "in parallel" if len(names) > 1 else "next"
    return f"{lead}; I'll run {', '.join(names)} {how}."


def _answer(ctx: _Context) -> str:
    ticket = ctx.pick(ctx.tickets) if ctx.tickets else ctx.ticket()
    return (f"Done. The root cause was {ctx.pick(ERROR_CODES)} raised in {ctx.path()} when "
            f"{ctx.project.library} {ctx.version()} returned a partial batch. I changed the "
            f"retry to back off and added a regression test in {ctx.test_path()}; "
            f"{ctx.rng.randint(40, 300)} tests pass. I linked the fix to {ticket}. "
            "Next: watch the error rate for a day before closing the ticket.")
