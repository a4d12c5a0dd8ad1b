"""The cluster a rehearsal runs on (rstar.pipeline.rehearsal): two hosts on one machine
(rstar.pipeline.hosts), each a Ray node whose "GPUs" are CPU ranks (rstar.train.verl_cpu), the
sandbox service's head on the first and a worker on the second; S3 (moto) and MLflow on this
machine, which the hosts reach by the names the recipe gives them (`sandbox_url`,
`tracking.tracking_uri`), as pods reach the cluster's services. The directory `workdir` stands
for the cluster's shared volume (RSTAR_CACHE, as infra/cluster/raycluster.yaml mounts it).

Every service is waited for with a deadline; one that does not come up ends the rehearsal with
an error naming it and its log.
"""

from __future__ import annotations

import os
import sys
import time
from urllib.parse import urlparse

from rstar.pipeline.hosts import Hosts

S3_PORT = 9000
RAY_PORT = 6379
START_TIMEOUT_S = 180
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "rehearsal",
    "AWS_SECRET_ACCESS_KEY": "rehearsal",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class RehearsalError(RuntimeError):
    """A rehearsal that cannot go on; the message names what failed and where its log is."""


# Memory and swap a rehearsal needs, GiB: it had used 23.8 GB of memory and 1.9 GB of swap
# (rl2) when Ray's monitor killed its workers; 4 training ranks, 4 vLLM replicas of 3 processes
# each (3.5 GB a replica), the agent loop, reward and router workers and the services.
MEMORY_GB = 36


def check_memory(meminfo: str = "/proc/meminfo") -> None:
    """Refuse, in one line, a machine with less memory and swap than MEMORY_GB."""
    with open(meminfo) as f:
        kb = {k: int(v.split()[0]) for k, v in (ln.split(":", 1) for ln in f if ":" in ln)}
    have = (kb.get("MemTotal", 0) + kb.get("SwapTotal", 0)) / 1024**2
    if have < MEMORY_GB:
        raise RehearsalError(
            f"a rehearsal needs {MEMORY_GB} GiB of memory and swap together, this machine has "
            f"{have:.1f} GiB; add swap (as root: fallocate -l 16G /var/tmp/swap && chmod 600 "
            "/var/tmp/swap && mkswap /var/tmp/swap && swapon /var/tmp/swap)"
        )


def _bin(name: str) -> str:
    return os.path.join(os.path.dirname(sys.executable), name)


def wait_for(check, what: str, log: str | None, timeout_s: float = START_TIMEOUT_S) -> None:
    """Poll `check()` until true; past `timeout_s` an error naming `what` and its log."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet: connection refused, no answer
            pass
        if time.monotonic() > deadline:
            where = f"; its log: {log}" if log else ""
            raise RehearsalError(f"{what} did not come up within {timeout_s:.0f} s{where}")
        time.sleep(1)


def _http_ok(url: str) -> bool:
    import httpx

    return httpx.get(url, timeout=5).status_code == 200


class RehearsalCluster:
    def __init__(self, workdir: str, recipe, ranks_per_node: int, nodes: int = 2) -> None:
        self.workdir, self.recipe = workdir, recipe
        self.ranks, self.nodes = ranks_per_node, nodes
        tracking = urlparse(recipe.tracking.tracking_uri)
        sandbox = urlparse(recipe.sandbox_url or "")
        if tracking.scheme != "http" or sandbox.scheme != "http":
            raise RehearsalError(
                "a rehearsal serves the recipe's MLflow and sandbox by their names: "
                "tracking.tracking_uri and sandbox_url must be http:// URLs (a cluster's)"
            )
        self.tracking, self.sandbox = tracking, sandbox
        self.hosts = Hosts(nodes, names={tracking.hostname: -1, sandbox.hostname: 0})
        self.logs = os.path.join(workdir, "logs")

    def log(self, name: str) -> str:
        return os.path.join(self.logs, f"{name}.log")

    @property
    def tracking_here(self) -> str:
        """The recipe's MLflow as this machine reaches it (the name resolves in the hosts only)."""
        return f"http://{self.hosts.here}:{self.tracking.port or 80}"

    @property
    def env(self) -> dict[str, str]:
        """The environment of every process of the rehearsal: S3 at this machine's address, the
        Ray head on host 0, the shared volume, a Prefect home of its own."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "RAY_"))}
        return {
            **env,
            **CREDENTIALS,
            "RSTAR_S3_ENDPOINT_URL": f"http://{self.hosts.here}:{S3_PORT}",
            "RSTAR_CACHE": os.path.join(self.workdir, "shared"),
            "PREFECT_HOME": os.path.join(self.workdir, "prefect"),
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
            "RAY_ADDRESS": f"{self.hosts.address(0)}:{RAY_PORT}",
            "RAY_AUTH_MODE": "token",
            # Ray refuses nodes that share a machine unless told this is not a laptop's cluster
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
            # both nodes count the whole machine's memory, and Ray's monitor killed workers (at
            # 95%, and at 99%) before the kernel paged idle processes (vLLM while verl trains)
            # out to swap: the kernel alone manages it here (`check_memory`)
            "RAY_memory_monitor_refresh_ms": "0",
        }

    def __enter__(self) -> RehearsalCluster:
        os.makedirs(self.logs, exist_ok=True)
        self.hosts.__enter__()
        try:
            self._start()
        except BaseException:
            self.hosts.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        import shutil

        self.hosts.__exit__(*exc)
        shutil.rmtree(self._ray_temp(), ignore_errors=True)

    def buckets(self, uris: list[str]) -> None:
        """Make the S3 buckets these s3:// URIs name."""
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=self.env["RSTAR_S3_ENDPOINT_URL"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        )
        for bucket in sorted({urlparse(u).netloc for u in uris if u.startswith("s3://")}):
            s3.create_bucket(Bucket=bucket)

    def _here(self, name: str, command: list[str], env: dict | None = None):
        """A service on this machine (the hosts' side of the bridge)."""
        return self.hosts.start(-1, command, {**self.env, **(env or {})}, self.log(name))

    def _start(self) -> None:
        here, env = self.hosts.here, self.env
        self._here("s3", [_bin("moto_server"), "-H", here, "-p", str(S3_PORT)])
        port = self.tracking.port or 80
        self._here(
            "mlflow",
            [_bin("mlflow"), "server", "--host", here, "--port", str(port), "--workers", "1"]
            + ["--backend-store-uri", f"sqlite:///{self.workdir}/mlflow.db"]
            + ["--artifacts-destination", os.path.join(self.workdir, "mlartifacts")]
            + ["--allowed-hosts", f"{self.tracking.hostname},{self.tracking.netloc},{here}"],
            # no job runner (its 5 consumer processes, 1.2 GB, run nothing the pipeline asks)
            {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
        ray_common = ["--block", "--num-gpus", str(self.ranks), "--num-cpus", "32"]
        ray_common += ["--object-store-memory", str(300 * 1024**2), "--disable-usage-stats"]
        head = self.hosts.address(0)
        self.hosts.start(
            0,
            [_bin("ray"), "start", "--head", "--node-ip-address", head, "--port", str(RAY_PORT)]
            + ["--include-dashboard", "false", "--temp-dir", self._ray_temp(), *ray_common],
            env,
            self.log("ray-head"),
        )
        sandbox_port = str(self.sandbox.port or 80)
        self.hosts.start(
            0,
            [_bin("rstar"), "sandbox", "serve", "--host", "0.0.0.0", "--port", sandbox_port]
            + ["--no-local"],
            env,
            self.log("sandbox-head"),
        )
        wait_for(lambda: _http_ok(f"http://{here}:{S3_PORT}/"), "S3 (moto)", self.log("s3"))
        wait_for(lambda: _http_ok(f"http://{here}:{port}/health"), "MLflow", self.log("mlflow"))
        wait_for(
            lambda: os.path.exists(os.path.join(self._ray_temp(), "session_latest")),
            "the Ray head",
            self.log("ray-head"),
        )
        for i in range(1, self.nodes):
            self.hosts.start(
                i,
                [_bin("ray"), "start", "--address", f"{head}:{RAY_PORT}"]
                + ["--node-ip-address", self.hosts.address(i), *ray_common],
                env,
                self.log(f"ray-node{i}"),
            )
            self.hosts.start(
                i,
                [_bin("rstar"), "sandbox", "serve", "--host", "0.0.0.0", "--port", "8081"]
                + ["--join", self.recipe.sandbox_url, "--executors", "1", "--slots", "8"]
                + ["--uid-base", str(400_000 + 1000 * i)],
                env,
                self.log(f"sandbox-node{i}"),
            )
        sandbox = f"http://{head}:{sandbox_port}/health"
        wait_for(lambda: _http_ok(sandbox), "the sandbox with a worker", self.log("sandbox-head"))
        wait_for(self._ray_nodes_alive, f"{self.nodes} Ray nodes", self.log("ray-node1"))

    def _ray_temp(self) -> str:
        # short: Ray's socket paths must fit 107 bytes
        return f"/tmp/rstar-rehearsal-{self.hosts.net}"

    def _ray_nodes_alive(self) -> bool:
        import subprocess

        probe = "import ray; ray.init(); print(sum(n['Alive'] for n in ray.nodes()))"
        run = subprocess.run(
            ["ip", "netns", "exec", self.hosts.netns(0), sys.executable, "-c", probe],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return run.returncode == 0 and run.stdout.strip().splitlines()[-1] == str(self.nodes)
