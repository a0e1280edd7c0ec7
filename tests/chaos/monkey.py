"""The chaos monkey: the planned faults of the chaos phase, delivered at their times.

SIGKILLs at random moments (a pool child, a whole worker, or the process caught inside
a swap transaction); at even intervals Redis restarts, PostgreSQL restarts (an immediate
stop: every backend dies) and hangs (the whole server SIGSTOPped), rounds of dropped
PostgreSQL connections, and rounds of poison pushed into the queue; workers that die on
their own are counted and restarted meanwhile.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable

from sqlalchemy import Engine, exc, or_, select

from db.models import SessionRow
from tests.chaos.config import ChaosConfig
from tests.chaos.endstate import KilledJob
from tests.chaos.fleet import Death, Fleet
from tests.chaos.poison import Poisoner
from tests.chaos.services import Services, drop_connections

SWAP_WATCH_S = 8.0
OVERTIME_S = 60.0  # the most the phase runs past its duration to deliver the kills asked


class Monkey:
    """Delivers the planned faults at their times in the chaos phase."""

    def __init__(self, config: ChaosConfig, fleet: Fleet, services: Services,
                 sniper: Engine, admin: Engine, poisoner: Poisoner,
                 session_ids: Callable[[], list[str]]) -> None:
        self._config, self._fleet, self._services = config, fleet, services
        self._sniper, self._admin = sniper, admin
        self._poisoner, self._session_ids = poisoner, session_ids
        self.faults: Counter[str] = Counter()  # the even-interval faults delivered
        self.killed_jobs: list[KilledJob] = []  # jobs whose process a kill ended
        self._on_wait: Callable[[], None] = lambda: None
        self._rng = random.Random(config.seed + 1)
        self.swap_watches = 0
        self.swap_kills: Counter[str] = Counter()  # how each killed swap transaction ended
        self.pg_drops = 0
        self.backends_terminated = 0

    def plan(self) -> list[tuple[float, str]]:
        """(seconds into the phase, fault): about 40% of the kills aimed at swaps, 20%
        at whole workers, the rest at pool children, in random order at random times."""
        config, rng = self._config, self._rng
        count = round(config.kills * 1.3)
        in_swap, whole = max(2, round(count * 0.4)), max(1, round(count * 0.2))
        kinds = ["in_swap"] * in_swap + ["whole_worker"] * whole
        kinds += ["pool_child"] * max(0, count - len(kinds))
        rng.shuffle(kinds)
        faults = [(rng.uniform(5, config.duration_s - 5), kind) for kind in kinds]
        spaced = ((config.redis_restarts, "redis"), (config.pg_drops, "postgres"),
                  (config.pg_restarts, "pg_restart"), (config.pg_hangs, "pg_hang"),
                  (config.poison_rounds, "poison"))
        for offset, (times, kind) in enumerate(spaced):  # kinds apart from one another
            faults += [(config.duration_s * (i + 0.3 + 0.1 * offset) / times, kind)
                       for i in range(times)]
        return sorted(faults)

    def run(self, started: float, *, on_wait: Callable[[], None]) -> None:
        """Deliver the plan from ``started``; ``on_wait`` runs every half second while
        waiting (restarting what died on its own)."""
        self._on_wait = on_wait
        for at_s, kind in self.plan():
            self.wait_until(started + at_s)
            self.deliver(kind)
        self.wait_until(started + self._config.duration_s)
        overtime = time.monotonic() + OVERTIME_S
        while sum(self._fleet.kills.values()) < self._config.kills:
            if time.monotonic() > overtime:
                return
            self.deliver("pool_child")
            self.wait_until(time.monotonic() + 1.0)

    def wait_until(self, moment: float) -> None:
        """Sleep until ``moment``, restarting any worker that died on its own meanwhile."""
        while (left_s := moment - time.monotonic()) > 0:
            time.sleep(min(left_s, 0.5))
            self._fleet.restart_crashed()
            self._on_wait()

    def deliver(self, kind: str) -> None:
        deaths = len(self._fleet.deaths)
        self._deliver(kind)
        for death in self._fleet.deaths[deaths:]:
            self.note_killed_jobs(death)

    def note_killed_jobs(self, death: Death) -> None:
        """The sessions whose lease a killed process held: their jobs died with it (the
        lease owner is ``host:pid:task``)."""
        owners = [f"%:{pid}:%" for pid in death.pids]
        if not owners:  # a worker killed while it had no pool children yet
            return
        try:
            with self._sniper.connect() as conn:
                rows = conn.execute(select(SessionRow.session_id, SessionRow.lease_owner)
                                    .where(or_(*(SessionRow.lease_owner.like(o)
                                                 for o in owners)))).all()
        except exc.DBAPIError:  # the database is down or hung: this kill goes unmeasured
            return
        self.killed_jobs += [KilledJob(death.at, row.session_id, str(row.lease_owner))
                             for row in rows]

    def _deliver(self, kind: str) -> None:
        fleet = self._fleet
        if kind == "in_swap":
            self.kill_in_swap()
        elif kind == "pool_child":
            fleet.kill_child()
        elif kind == "whole_worker":
            fleet.kill_worker()
        elif kind == "redis":
            self._services.redis.restart(down_s=self._rng.uniform(0.5, 2.0))
        elif kind == "pg_restart":
            self._services.postgres.restart(down_s=self._rng.uniform(1.0, 3.0))
        elif kind == "pg_hang":
            self._services.postgres.hang(self._config.pg_hang_s)
        elif kind == "poison":
            self._poisoner.push_round(self._rng.sample(self._session_ids(), 3))
        else:
            self.pg_drops += 1
            self.backends_terminated += drop_connections(self._admin)
        if kind in ("redis", "pg_restart", "pg_hang", "poison", "postgres"):
            self.faults[kind] += 1

    def kill_in_swap(self) -> None:
        """Every other watch freezes swaps mid-transaction first (see Fleet.kill_in_swap);
        a watch that sees no swap kills a pool child instead."""
        self.swap_watches += 1
        freeze = self.swap_watches % 2 == 1
        ended = self._fleet.kill_in_swap(self._sniper, watch_s=SWAP_WATCH_S, freeze=freeze)
        if ended is None:
            self._fleet.kill_child()
        else:
            self.swap_kills[ended] += 1
