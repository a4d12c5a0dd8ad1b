"""The balanced scheduler's placement as verl's load balancer: sticky by rollout, by free KV."""

from rstar.rollout.verl_router import KVBalancedRouter


def acquire(router, rid, prompt, new):
    return router.acquire_server(rid, prompt_ids=[0] * prompt, sampling_params={"max_tokens": new})[
        0
    ]


def test_new_rollouts_go_where_most_kv_is_free_and_later_turns_go_home():
    router = KVBalancedRouter({"a": "A", "b": "B"}, {"kv_cache_tokens": 1000})
    assert router.require_acquire_fields() == ["prompt_ids", "sampling_params"]
    first = acquire(router, "r1", 300, 300)  # 600 reserved there
    second = acquire(router, "r2", 100, 100)  # the other replica has more room
    assert first != second
    router.release_server(first, request_id="r1")  # r1 waits on its tool call, holding nothing
    assert router.get_status()["kv_reserved"] == {first: 0, second: 200}
    # its next turn: back where its prefix is cached
    assert acquire(router, "r1", 350, 300) == first
    assert router.get_total_inflight() == 2


def test_a_full_home_sends_the_turn_to_a_replica_with_room_and_nothing_is_lost():
    router = KVBalancedRouter({"a": "A", "b": "B"}, {"kv_cache_tokens": 1000})
    home = acquire(router, "r1", 100, 100)
    other = acquire(router, "big", 300, 300)  # the other replica: 600 reserved
    assert other != home
    assert acquire(router, "fill", 400, 400) == home  # home: 200 + 800 = 1000, full
    router.release_server(home, request_id="r1")  # home: 800 reserved, 200 free
    # 350 does not fit at home: recomputed where it fits
    assert acquire(router, "r1", 250, 100) == other
    # nothing fits anywhere: the request still gets a server (verl cannot wait), counted
    acquire(router, "huge", 900, 900)
    assert router.get_status()["overcommitted"] == 1
    for rid in ("big", "fill", "r1", "huge"):
        router.release_server("?", request_id=rid)
    assert set(router.get_status()["kv_reserved"].values()) == {0}


def test_servers_come_and_go_and_the_sticky_cache_clears():
    router = KVBalancedRouter({"a": "A"})  # no capacity given: by least KV reserved
    assert acquire(router, "r1", 10, 10) == "a"
    router.release_server("a", request_id="r1")
    router.add_servers({"b": "B"})
    router.remove_servers(["a"])
    assert acquire(router, "r1", 10, 10) == "b"  # its home is gone: placed afresh
    assert router.get_all_servers() == ["b"]
    assert router.clear_sticky_cache()["cleared_entries"] == 1


def test_the_homes_stay_bounded_over_many_steps_and_a_live_rollout_keeps_its_home():
    """verl never says a rollout ended: the map keeps the `max_homes` rollouts seen last, its size
    flat however many steps run, and one that keeps coming back is not the one dropped."""
    router = KVBalancedRouter({"a": "A", "b": "B"}, {"kv_cache_tokens": 10_000, "max_homes": 64})
    live = acquire(router, "live", 10, 10)
    router.release_server(live, request_id="live")
    sizes = []
    for step in range(50):
        for i in range(40):  # a step's rollouts, one turn each
            rid = f"s{step}-{i}"
            router.release_server(acquire(router, rid, 10, 10), request_id=rid)
        # the live rollout's next turn, holding its place among the recent: never dropped in
        # between (dropped, it would be placed afresh, here on the same idle replica by chance)
        assert "live" in router.home, step
        router.release_server(acquire(router, "live", 10, 10), request_id="live")
        sizes.append(len(router.home))
    assert max(sizes) == 64 and sizes[-1] == 64
    assert router.home["live"] == live
    assert "s0-0" not in router.home
