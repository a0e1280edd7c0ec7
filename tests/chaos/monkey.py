"""The chaos monkey: the planned faults of the chaos phase, delivered at their times.

SIGKILLs at random moments (a pool child, a whole worker, or the process caught inside
a swap transaction), Redis restarts and rounds of dropped PostgreSQL connections at
even intervals; workers that die on their own are counted and restarted meanwhile.
"""

from __future__ import annotations

import random
import time
from collections import Counter

from sqlalchemy import Engine

from tests.chaos.config import ChaosConfig
from tests.chaos.fleet import Fleet
from tests.chaos.services import Services, drop_connections

SWAP_WATCH_S = 8.0
OVERTIME_S = 60.0  # the most the phase runs past its duration to deliver the kills asked


class Monkey:
    """Delivers the planned faults at their times in the chaos phase."""

    def __init__(self, config: ChaosConfig, fleet: Fleet, services: Services,
                 sniper: Engine, admin: Engine) -> None:
        self._config, self._fleet, self._services = config, fleet, services
        self._sniper, self._admin = sniper, admin
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
        for times, kind in ((config.redis_restarts, "redis"), (config.pg_drops, "postgres")):
            faults += [(config.duration_s * (i + 0.5) / times, kind) for i in range(times)]
        return sorted(faults)

    def run(self, started: float) -> None:
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

    def deliver(self, kind: str) -> None:
        fleet = self._fleet
        if kind == "in_swap":
            self.kill_in_swap()
        elif kind == "pool_child":
            fleet.kill_child()
        elif kind == "whole_worker":
            fleet.kill_worker()
        elif kind == "redis":
            self._services.redis.restart(down_s=self._rng.uniform(0.5, 2.0))
        else:
            self.pg_drops += 1
            self.backends_terminated += drop_connections(self._admin)

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
