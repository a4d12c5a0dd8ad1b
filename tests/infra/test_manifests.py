"""The cluster manifests, checked: every Kubernetes object against the API schema (strict:
unknown fields rejected) with kubernetes-validate; the RayCluster's pod templates as the pod
templates they are (no KubeRay schema ships offline, so its own fields are checked by name);
the compose file's references."""

import os

import kubernetes_validate as kv
import yaml

CLUSTER = os.path.join(os.path.dirname(__file__), "..", "..", "infra", "cluster")
K8S = "1.37.0"


def docs(name: str) -> list[dict]:
    with open(os.path.join(CLUSTER, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def test_the_sandbox_service_objects_pass_the_kubernetes_schema():
    objects = docs("sandbox.yaml")
    assert {(o["kind"], o["metadata"]["name"]) for o in objects} >= {
        ("Deployment", "sandbox-head"),
        ("Deployment", "sandbox-worker"),
        ("Service", "sandbox-head"),
        ("NetworkPolicy", "sandbox-callers"),
    }
    for o in objects:
        kv.validate(o, K8S, strict=True)
    service = next(o for o in objects if o["kind"] == "Service")
    head = next(
        o for o in objects if o["metadata"]["name"] == "sandbox-head" and o["kind"] == "Deployment"
    )
    # the Service finds the head
    assert service["spec"]["selector"] == head["spec"]["template"]["metadata"]["labels"]
    # the recipes' sandbox_url names this Service and port
    with open(os.path.join(CLUSTER, "..", "..", "configs", "qwen3-14b.yaml")) as f:
        assert (
            yaml.safe_load(f)["sandbox_url"]
            == f"http://sandbox-head:{service['spec']['ports'][0]['port']}"
        )


def test_sandbox_workers_advertise_their_pod_ip_and_the_head_is_ready_before_they_join(
    monkeypatch,
):
    """A worker binds 0.0.0.0 but must join the head under an address the head can call (its
    pod IP, from the downward API); the head answers /health 503 until a worker has joined, so
    its readiness is /ping, else workers could never reach it through its Service."""
    import re

    from typer.testing import CliRunner

    from rstar.cli import sandbox as sandbox_cli
    from rstar.sandbox import process

    objects = {o["metadata"]["name"]: o for o in docs("sandbox.yaml") if o["kind"] == "Deployment"}
    (worker,) = objects["sandbox-worker"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in worker["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    pod = {"POD_IP": "10.1.2.3"}  # Kubernetes expands $(VAR) in a command from the env
    args = [re.sub(r"\$\((\w+)\)", lambda m: pod[m[1]], a) for a in worker["command"]]
    assert args[:3] == ["rstar", "sandbox", "serve"]
    seen = {}
    monkeypatch.setattr(process, "serve", lambda host, port, cfg, **kw: seen.update(kw, port=port))
    result = CliRunner().invoke(sandbox_cli.app, ["serve", *args[3:]])
    assert result.exit_code == 0, result.output
    assert seen["public_url"] == f"http://10.1.2.3:{seen['port']}"
    assert seen["port"] == worker["ports"][0]["containerPort"]
    (head,) = objects["sandbox-head"]["spec"]["template"]["spec"]["containers"]
    assert head["readinessProbe"]["httpGet"]["path"] == "/ping"
    assert worker["readinessProbe"]["httpGet"]["path"] == "/health"  # ready when it can run calls
    # the uid leases live on the node, shared by its worker pods, not in each pod's own /tmp
    from rstar.sandbox.uids import LOCK_DIR_ENV

    locks = env[LOCK_DIR_ENV]["value"]
    (mount,) = [m for m in worker["volumeMounts"] if m["mountPath"] == locks]
    volumes = objects["sandbox-worker"]["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == mount["name"])["hostPath"]["path"] == locks


def test_the_rayclusters_pod_templates_are_valid_pod_templates():
    (cluster,) = docs("raycluster.yaml")
    assert cluster["kind"] == "RayCluster" and set(cluster["spec"]) <= {
        "rayVersion",
        "headGroupSpec",
        "workerGroupSpecs",
    }
    groups = [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]
    for group in groups:
        kv.validate(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "check"},
                "template": group["template"],
            },
            K8S,
            strict=True,
        )
    gpus = [
        g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu", 0)
        for g in cluster["spec"]["workerGroupSpecs"]
    ]
    with open(os.path.join(CLUSTER, "..", "..", "configs", "qwen3-14b.yaml")) as f:
        resources = yaml.safe_load(f)["resources"]
    assert (
        gpus == [resources["gpus"]]
        and cluster["spec"]["workerGroupSpecs"][0]["replicas"] == resources["nodes"]
    )


def test_the_compose_files_references_resolve():
    (compose,) = docs("services.compose.yaml")
    services = compose["services"]
    for name, svc in services.items():
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{name} depends on unknown service {dep}"
        for volume in svc.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in compose.get("volumes", {}), (
                    f"{name} mounts undeclared volume {source}"
                )


def test_every_ray_pod_keeps_stage_files_on_the_shared_volume():
    (claim,) = docs("storage.yaml")
    kv.validate(claim, K8S, strict=True)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # every node reads and writes it
    (cluster,) = docs("raycluster.yaml")
    for group in [cluster["spec"]["headGroupSpec"], *cluster["spec"]["workerGroupSpecs"]]:
        pod = group["template"]["spec"]
        volume = next(
            v["name"]
            for v in pod["volumes"]
            if v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"]
        )
        container = pod["containers"][0]
        mount = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == volume)
        env = {e["name"]: e["value"] for e in container["env"]}
        # model mirrors, verl's files and checkpoints (rstar.storage.dirs.local_dir) and the hub
        # cache
        assert env["RSTAR_CACHE"].startswith(mount + "/") and env["HF_HOME"].startswith(mount + "/")


# the node type the 14B recipe's workers are sized for (raycluster.yaml): 8 x 80 GB GPUs,
# 96 vCPU, 1,152 GiB; what a node keeps for the kubelet, the system and DaemonSets
NODE = {"cpu": 96, "memory_gi": 1152, "gpus": 8}
NODE_RESERVE = {"cpu": 4, "memory_gi": 64}


def test_a_gpu_worker_pod_fits_the_node_it_is_sized_for():
    """Requests equal limits (a Guaranteed pod) and leave the node its reserve: a pod of 96 CPUs
    and 1,600 GiB could not be scheduled on the 96 vCPU / 1,152 GiB nodes the recipe names."""
    (cluster,) = docs("raycluster.yaml")
    (worker,) = cluster["spec"]["workerGroupSpecs"]
    resources = worker["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    limits = resources["limits"]
    assert float(limits["cpu"]) <= NODE["cpu"] - NODE_RESERVE["cpu"]
    assert int(limits["memory"].removesuffix("Gi")) <= NODE["memory_gi"] - NODE_RESERVE["memory_gi"]
    assert limits["nvidia.com/gpu"] == NODE["gpus"]
    # the shared-memory volume lives inside the pod's memory
    shm = next(v for v in worker["template"]["spec"]["volumes"] if v["name"] == "shm")
    assert int(shm["emptyDir"]["sizeLimit"].removesuffix("Gi")) < int(
        limits["memory"].removesuffix("Gi")
    )


def test_sandbox_workers_run_on_cpu_nodes_with_room_for_them():
    """A worker's CPU quota does not fit beside a GPU node's Ray worker: the workers select
    another pool, which the GPU workers do not."""
    (sandbox,) = [o for o in docs("sandbox.yaml") if o["metadata"]["name"] == "sandbox-worker"]
    pod = sandbox["spec"]["template"]["spec"]
    quota = float(pod["containers"][0]["resources"]["limits"]["cpu"])
    (cluster,) = docs("raycluster.yaml")
    (gpu,) = cluster["spec"]["workerGroupSpecs"]
    ray_cpu = float(gpu["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    assert quota > NODE["cpu"] - ray_cpu
    assert pod["nodeSelector"] and pod["nodeSelector"] != gpu["template"]["spec"].get(
        "nodeSelector"
    )


def test_the_mlflow_host_the_14b_recipe_names_is_a_service_of_the_manifests():
    """The recipe's tracking_uri (http://mlflow:5000) resolves in the cluster: a Service of that
    name and port selects the MLflow server's pods, all valid Kubernetes objects."""
    from urllib.parse import urlparse

    objects = docs("mlflow.yaml")
    for o in objects:
        kv.validate(o, K8S, strict=True)
    with open(os.path.join(CLUSTER, "..", "..", "configs", "qwen3-14b.yaml")) as f:
        url = urlparse(yaml.safe_load(f)["tracking"]["tracking_uri"])
    service = next(
        o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == url.hostname
    )
    assert url.port in [p["port"] for p in service["spec"]["ports"]]
    server = next(o for o in objects if o["kind"] == "Deployment")
    assert service["spec"]["selector"] == server["spec"]["template"]["metadata"]["labels"]
    container = server["spec"]["template"]["spec"]["containers"][0]
    assert f"--port {url.port}" in container["command"][-1]
