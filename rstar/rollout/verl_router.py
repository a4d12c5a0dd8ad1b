"""The balanced scheduler as verl's rollout load balancer (`rollout.router_config_path`).

verl 0.9.1 routes every generation request through one load-balancer actor: `acquire_server`
before the request, `release_server` after it. Its default keeps a rollout on the replica it
started on and otherwise picks the one with the fewest requests in flight, whatever their
length. This one places by KV cache, as `rstar.rollout.scheduler.BalancedScheduler` does (the
same `plan_dispatch`): a request reserves its context plus its max new tokens; a later turn
of a rollout goes back to the replica holding its prefix if it fits there, else to the
replica with the most free KV; a new rollout to the replica with the most free KV.

verl's acquire cannot make a request wait, so when no replica has room the request goes to
its home (or the emptiest replica) anyway, and vLLM queues it there; `overcommitted` counts
those. `kv_cache_tokens` (per replica) comes from the router YAML; without it, placement is by
least KV reserved, with no capacity limit.

The homes (rollout -> replica) are kept for the `max_homes` rollouts seen last (router YAML,
default 65,536: four times the paper's 16K rollouts a step): verl never tells the balancer a
rollout ended, and a map of every rollout grew to about one entry per request by the end of a
stage (~5M in rl1). A rollout whose home was dropped places as a new one.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from rstar.logs import configure
from rstar.rollout.scheduler import plan_dispatch

log = logging.getLogger(__name__)

UNLIMITED = 1 << 62
MAX_HOMES = 1 << 16


class KVBalancedRouter:
    def __init__(self, servers: dict, config: dict | None = None) -> None:
        self.capacity = int((config or {}).get("kv_cache_tokens") or UNLIMITED)
        self.servers: dict = dict(servers)
        self.reserved: dict[str, int] = dict.fromkeys(servers, 0)
        # request id (a rollout) -> server, the most recently used last
        self.home: OrderedDict[str, str] = OrderedDict()
        self.max_homes = int((config or {}).get("max_homes") or MAX_HOMES)
        self.inflight: dict[str, tuple[str, int]] = {}  # request id -> (server, KV reserved)
        self.overcommitted = 0
        # verl makes its balancer in an actor process of its own: log there as the stage does
        configure()
        log.info(
            "[rstar] KV-balanced load balancer over %d replica(s), %s KV tokens each",
            len(servers),
            "no cap" if self.capacity == UNLIMITED else self.capacity,
        )

    # -- verl's RequestLoadBalancer protocol ---------------------------------------------
    def require_acquire_fields(self) -> list[str]:
        return ["prompt_ids", "sampling_params"]

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def acquire_server(
        self,
        request_id: str,
        prompt_ids: list[int] | None = None,
        sampling_params: dict | None = None,
    ) -> tuple[str, object]:
        if not self.servers:
            raise RuntimeError("No available servers in load balancer")
        ids = list(self.servers)
        need = len(prompt_ids or []) + int((sampling_params or {}).get("max_tokens") or 0)
        free = [self.capacity - self.reserved[s] for s in ids]
        home = (
            ids.index(self.home[request_id]) if self.home.get(request_id) in self.servers else None
        )
        resumed, new = plan_dispatch(
            free,
            [True] * len(ids),
            [(need, home)] if home is not None else [],
            [] if home is not None else [need],
        )
        i = resumed[0] if home is not None else (new[0] if new else None)
        # no replica has room: cannot wait here, so queue where the prefix is (or the emptiest)
        if i is None:
            self.overcommitted += 1
            i = home if home is not None else max(range(len(ids)), key=free.__getitem__)
        server = ids[i]
        self.home[request_id] = server
        self.home.move_to_end(request_id)
        if len(self.home) > self.max_homes:
            self.home.popitem(last=False)
        self.inflight[request_id] = (server, need)
        self.reserved[server] += need
        return server, self.servers[server]

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        server, need = self.inflight.pop(request_id, (server_id, 0))
        if server in self.reserved:
            self.reserved[server] -= need

    def add_servers(self, servers: dict) -> None:
        self.servers.update(servers)
        for s in servers:
            self.reserved.setdefault(s, 0)

    def remove_servers(self, server_ids: list[str]) -> None:
        for s in server_ids:
            self.servers.pop(s, None)
            self.reserved.pop(s, None)

    def get_all_servers(self) -> list[str]:
        return list(self.servers)

    def get_status(self) -> dict:
        return {
            "servers": list(self.servers),
            "total_inflight": len(self.inflight),
            "active_servers": len(self.servers),
            "kv_reserved": dict(self.reserved),
            "overcommitted": self.overcommitted,
        }

    def clear_sticky_cache(self) -> dict:
        cleared = len(self.home)
        self.home.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self.reserved)}

    def get_total_inflight(self) -> int:
        return len(self.inflight)
