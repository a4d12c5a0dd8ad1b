"""The 14B recipe's rehearsal (rstar.pipeline.rehearsal): its verl command lines are the plan's
but for the keys it names, and the GPU settings it keeps are the plan's, on CPU ranks."""

import pytest

from rstar.pipeline import rehearsal
from rstar.pipeline.config import ConfigError, load_recipe
from rstar.pipeline.plan import check_verl, check_verl_sft, plan
from rstar.train.gpu_sizing import KNOWN, ranks_for, size, size_sft

CONFIG = "configs/qwen3-14b.yaml"


def plans(extra: dict | None = None):
    """The 14B plan and its rehearsal's (with `extra` --set values on top), stage by stage."""
    planned = plan(load_recipe(CONFIG, check_inputs=False))
    values = {**rehearsal.overrides(CONFIG, {}, "/nonexistent/stand-in"), **(extra or {})}
    return planned, plan(load_recipe(CONFIG, values, check_inputs=False))


def test_the_rehearsals_verl_lines_are_the_plans_but_for_the_allowed_keys():
    planned, rehearsed = plans()
    compared = rehearsal.compare(planned, rehearsed)
    assert [c["name"] for c in compared] == [s["name"] for s in planned]
    assert all(c["refused"] == [] for c in compared), compared
    by_name = {c["name"]: c["differs"] for c in compared}
    assert by_name["base"] == by_name["problems"] == by_name["mine"] == {}
    for name in ("sft", "rl1", "rl2", "rl3"):
        # CPU ranks for GPUs: two nodes of two, each stage sharded within a node as planned
        assert by_name[name]["trainer.device"] == [None, "cpu"]
        assert by_name[name]["trainer.nnodes"] == ["8", "2"]
        assert by_name[name]["trainer.n_gpus_per_node"] == ["8", "2"]
    for name in ("rl1", "rl2", "rl3"):
        assert by_name[name]["actor_rollout_ref.actor.fsdp_config.fsdp_size"] == ["8", "2"]
    assert by_name["sft"]["engine.fsdp_size"] == ["8", "2"]
    # what the plan sets for memory and the network runs as planned: not among the differences
    kept = [
        "actor_rollout_ref.actor.fsdp_config.param_offload",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
        "actor_rollout_ref.model.enable_gradient_checkpointing",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.rollout.max_num_batched_tokens",
        "actor_rollout_ref.actor.optim.lr",
        "actor_rollout_ref.actor.clip_ratio_high",
    ]
    rl1 = dict(a.split("=", 1) for a in rehearsed[3]["command"][3:])
    assert [k for k in kept if k in by_name["rl1"]] == []
    assert rl1["actor_rollout_ref.actor.fsdp_config.param_offload"] == "true"
    assert "model.enable_gradient_checkpointing=false" not in rehearsed[2]["command"]
    # and verl takes the rehearsal's lines as they are
    check_verl_sft(rehearsed[2]["command"][3:])
    for stage in rehearsed[3:5]:
        check_verl(stage["command"][3:])


def test_a_change_outside_the_allowed_keys_is_named():
    planned, rehearsed = plans({"rl.0.clip_high": 0.3, "sft.train.lr": 1e-5})
    refused = {c["name"]: c["refused"] for c in rehearsal.compare(planned, rehearsed)}
    assert refused["rl1"] == ["actor_rollout_ref.actor.clip_ratio_high"]
    assert refused["sft"] == ["optim.lr"]
    assert refused["rl2"] == []


@pytest.mark.parametrize(
    ("gpus", "ranks"), [(8, 2), (16, 4), (4, 1), (1, 1)], ids=["node", "two-nodes", "half", "one"]
)
def test_a_shard_group_on_cpu_ranks_is_the_same_share_of_a_node(gpus, ranks):
    assert ranks_for(gpus, 8, 2) == ranks


def test_the_plans_settings_on_ranks_keep_all_but_the_counts():
    settings = size(KNOWN["Qwen/Qwen3-14B-Base"], 80, 64, 2048, 8192, 512, 8)
    mapped = settings.on_ranks(2, 2, 4)
    assert (mapped.gpus, mapped.per_node, mapped.fsdp_size, mapped.tensor_parallel) == (4, 2, 2, 1)
    assert mapped.micro_batch_rows == settings.micro_batch_rows
    sft = size_sft(KNOWN["Qwen/Qwen3-14B-Base"], 80, 64, 8192, 128, 8).on_ranks(2, 2)
    assert (sft.gpus, sft.per_node, sft.fsdp_size) == (4, 2, 2)


def test_a_rehearsal_needs_verl_on_ranks():
    with pytest.raises(ConfigError, match="a rehearsal runs engine 'verl' on CPU ranks"):
        load_recipe("configs/tiny.yaml", {"rehearsal": {"plan": CONFIG}}, check_inputs=False)


def test_hosts_reach_each_other_and_this_machine_by_the_recipes_names_and_leave_nothing():
    """Two network namespaces on a bridge: host 1 serves, host 0 calls it by a name the hosts
    file gives and this machine by its bridge address, and its own name resolves to its own
    address; on exit no namespace, link or process is left."""
    import subprocess
    import sys

    from rstar.pipeline.hosts import Hosts

    def links() -> str:
        return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout

    serve = [sys.executable, "-m", "http.server", "8999", "--bind"]
    with Hosts(2, names={"sandbox-head": 1, "mlflow": -1}) as hosts:
        server = hosts.start(1, [*serve, hosts.address(1)])
        here = hosts.start(-1, [*serve, hosts.here])
        probe = (
            "import socket, time, urllib.request as u\n"
            "print(socket.gethostbyname(socket.gethostname()))\n"
            "for url in ('http://sandbox-head:8999/', 'http://mlflow:8999/'):\n"
            "    for _ in range(100):\n"
            "        try:\n"
            "            print(u.urlopen(url, timeout=2).status); break\n"
            "        except OSError: time.sleep(0.1)\n"
        )
        run = subprocess.run(
            ["ip", "netns", "exec", hosts.netns(0), sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            timeout=60,
        )
        # its own name is its own address (gloo advertises it to the other ranks)
        assert run.stdout.split() == [hosts.address(0), "200", "200"], run.stderr
        bridge, namespaces = hosts.bridge, [hosts.netns(i) for i in range(2)]
        assert bridge in links()
    assert server.poll() is not None and here.poll() is not None
    assert bridge not in links()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in namespaces)


def test_a_machine_without_the_memory_is_refused_in_one_line(tmp_path):
    from rstar.pipeline.rehearsal_cluster import MEMORY_GB, RehearsalError, check_memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683992 kB\nSwapTotal:             0 kB\n")
    with pytest.raises(RehearsalError, match=f"needs {MEMORY_GB} GiB of memory and swap together"):
        check_memory(str(meminfo))
    meminfo.write_text("MemTotal:       24683992 kB\nSwapTotal:      16777212 kB\n")
    check_memory(str(meminfo))


def test_values_known_only_at_run_time_are_allowed_only_when_comparing_what_ran():
    ran = ["++ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM", "model.path", "optim.lr"]
    assert rehearsal.refused(ran, run_time=True) == ["optim.lr"]
    assert rehearsal.refused(ran) == sorted(ran)
