"""MLflow records of a pipeline: one parent run, a child run per stage, its resolved config as
params, per-step metrics, datasets with content digests, PNG curves, and each stage's
model registered as a version tagged with its stage and the version it started from.

Everything goes through `MlflowClient` with explicit run ids (never the "active run"), so
the same calls work from the Prefect flow, a Prefect task thread, or a Ray worker process.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from contextlib import contextmanager

from rstar.errors import NotRetryable

STAGE, PIPELINE, INPUT_MODEL, EVALUATES, DIGEST = (
    "rstar.stage",
    "rstar.pipeline",
    "rstar.input_model",
    "rstar.evaluates",
    "rstar.model_digest",
)
NOTE = "mlflow.note.content"  # what MLflow's UI shows as a run's, experiment's description
EXPERIMENT_NOTE = (
    "Runs of the rstar pipeline. Each pipeline run is a parent run `pipeline:<recipe>` holding "
    "the headline (held-out accuracy per checkpoint as `heldout/<checkpoint>`, the verdict, the "
    "evaluation report), with a child run per stage (base, problems, sft, rl1-rl3, mine, "
    "evaluate). Re-evaluations are runs labelled `reeval-<time>`."
)
EVAL_LABEL = (
    "rstar.eval_label"  # an evaluation's name: "eval" (the pipeline's own), "reeval-<time>"
)
# a dataset a stage wrote: tag `rstar.output.<name>` = {"uri", "digest"} (MLflow 3.17's run
# outputs take logged models only; a dataset logged as an input, even with context "output",
# reads in MLflow's UI as one the stage took)
OUTPUT = "rstar.output."
LOGGED_MODEL = "rstar.logged_model"  # a model version's logged model (its id)
EVALUATED = "rstar.evaluated"  # a version's tag per evaluation of it, by the evaluation's label


def absolute_uri(uri: str) -> str:
    """`sqlite:///mlruns.db` names a file relative to the current directory; make it absolute
    so Ray workers, whose working directory differs, write to the same database."""
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        return prefix + os.path.abspath(uri[len(prefix) :])
    return uri


class TrackingUnreachable(NotRetryable, RuntimeError):
    """The MLflow tracking server does not answer: nothing to retry, a setting or a server to
    fix."""


def check_reachable(tracking_uri: str, timeout_s: float = 5.0) -> None:
    """For an http(s) tracking URI, one request with a short timeout, so a dead server is one
    clear error in seconds (MLflow's own client retries for minutes before it says so)."""
    import urllib.error
    import urllib.request

    if not tracking_uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{tracking_uri.rstrip('/')}/health", timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # it answered (an older server or a proxy without /health): reachable
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise TrackingUnreachable(
            f"MLflow tracking server {tracking_uri} does not answer ({reason}); start it "
            "(infra/start-local-stack.sh) or set tracking.tracking_uri"
        ) from None


_initialised: set[str] = set()


def client(tracking_uri: str):
    from mlflow import MlflowClient

    uri = absolute_uri(tracking_uri)
    if not uri.startswith("sqlite:///") or uri in _initialised:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    # MLflow creates and migrates a SQLite store on first use; two processes doing that at once
    # corrupt it (a double-clicked Run on a fresh store). A process's first use goes under a lock.
    import fcntl

    with open(uri[len("sqlite:///") :] + ".init-lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        c = MlflowClient(tracking_uri=uri, registry_uri=uri)
        c.search_experiments(max_results=1)
        c.search_registered_models(max_results=1)
    _initialised.add(uri)
    return c


def _key(name: str) -> str:
    return re.sub(r"[^\w\-. /:]", "_", name)  # MLflow's allowed characters; '@' in pass@k is not


def flatten(tree, prefix: str = "") -> dict[str, str]:
    """{"rl.0.steps": "12", ...}: nested dicts and lists as dotted keys, values as MLflow params."""
    if not isinstance(tree, (dict, list)):
        return {prefix[:-1]: str(tree)[:6000]}
    out = {}
    for k, v in tree.items() if isinstance(tree, dict) else enumerate(tree):
        out.update(flatten(v, f"{prefix}{k}."))
    return out


def start_run(
    tracking_uri: str,
    experiment: str,
    name: str,
    *,
    parent: str | None = None,
    params: dict | None = None,
    tags: dict | None = None,
) -> str:
    from mlflow.entities import Param

    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    # its kind: MLflow's UI shows a model-training experiment, not its GenAI (traces) pages
    kind = {"mlflow.experimentKind": "custom_model_development"}
    exp_id = (
        exp.experiment_id
        if exp
        else c.create_experiment(experiment, tags={NOTE: EXPERIMENT_NOTE, **kind})
    )
    all_tags = {"mlflow.runName": name, **(tags or {})}
    if parent:
        all_tags["mlflow.parentRunId"] = parent
    run_id = c.create_run(exp_id, tags=all_tags, run_name=name).info.run_id
    items = [Param(_key(k), v) for k, v in flatten(params or {}).items()]
    for i in range(0, len(items), 100):
        c.log_batch(run_id, params=items[i : i + 100])
    return run_id


ROOT = "rstar.storage_root"


def fail_stale_runs(tracking_uri: str, experiment: str, root: str) -> list[str]:
    """Runs of pipelines on `root` still RUNNING, and their stage runs: a killed process left them
    so (its clean-up never ran). Called by a run that holds `root`'s lock, so none is live.
    Marks them FAILED, tagged `rstar.reconciled`; returns their ids."""
    c = client(tracking_uri)
    exp = c.get_experiment_by_name(experiment)
    if exp is None:
        return []
    stale = c.search_runs(
        [exp.experiment_id], f"attributes.status = 'RUNNING' and tags.`{ROOT}` = '{root}'"
    )
    ids = [r.info.run_id for r in stale]
    for parent in list(ids):
        ids += [
            r.info.run_id
            for r in c.search_runs(
                [exp.experiment_id],
                f"attributes.status = 'RUNNING' and tags.`mlflow.parentRunId` = '{parent}'",
            )
        ]
    for run_id in ids:
        c.set_tag(
            run_id,
            "rstar.reconciled",
            "left RUNNING by a process that died; marked FAILED by a later run",
        )
        c.set_terminated(run_id, "FAILED")
    return ids


def reopen_run(tracking_uri: str, run_id: str, *, parent: str, tags: dict) -> bool:
    """Continue `run_id`, a stage's run that an earlier attempt left FAILED (or RUNNING, killed):
    back to RUNNING, moved under `parent` (the pipeline run now doing the work), its earlier
    parents kept in `rstar.earlier_pipelines`. False when the run is gone or finished."""
    from mlflow.exceptions import MlflowException

    c = client(tracking_uri)
    try:
        run = c.get_run(run_id)
    except MlflowException:
        return False  # another tracking store, or deleted
    if run.info.status == "FINISHED" or run.info.lifecycle_stage == "deleted":
        return False
    old = run.data.tags.get("mlflow.parentRunId")
    earlier = [p for p in run.data.tags.get("rstar.earlier_pipelines", "").split(",") if p]
    if old and old != parent and old not in earlier:
        earlier.append(old)
    c.update_run(run_id, status="RUNNING")
    if "rstar.reconciled" in run.data.tags:  # failed by the next run after a kill: live again now
        c.delete_tag(run_id, "rstar.reconciled")
    set_tags(
        tracking_uri,
        run_id,
        {
            **tags,
            "mlflow.parentRunId": parent,
            "rstar.earlier_pipelines": ",".join(earlier),
            "rstar.attempts": int(run.data.tags.get("rstar.attempts", "1")) + 1,
        },
    )
    return True


def where(tracking_uri: str, run_id: str) -> str:
    """Where a person finds run `run_id`: its page in the MLflow UI when the store is an MLflow
    server (its UI is at the same address), else the store and the `mlflow ui` command."""
    if tracking_uri.startswith(("http://", "https://")):
        experiment = client(tracking_uri).get_run(run_id).info.experiment_id
        return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment}/runs/{run_id}"
    return f"run {run_id} in {tracking_uri} (mlflow ui --backend-store-uri {tracking_uri})"


def end_run(tracking_uri: str, run_id: str, status: str = "FINISHED") -> None:
    client(tracking_uri).set_terminated(run_id, status)


@contextmanager
def closing(tracking_uri: str, run_id: str):
    """The body's work under the run `run_id`: it ends FINISHED when the body returns, FAILED
    when it raises an error and KILLED when it is stopped from outside (a cancel, Ctrl-C: an
    exception that is no `Exception`), so no run is left RUNNING."""
    try:
        yield run_id
    except BaseException as e:
        end_run(tracking_uri, run_id, "FAILED" if isinstance(e, Exception) else "KILLED")
        raise
    end_run(tracking_uri, run_id)


def set_tags(tracking_uri: str, run_id: str, tags: dict) -> None:
    c = client(tracking_uri)
    for k, v in tags.items():
        c.set_tag(run_id, k, str(v))


class StageLog:
    """What a stage writes to its MLflow run while it works."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.tracking_uri, self.run_id = tracking_uri, run_id
        self.c = client(tracking_uri)

    def metrics(self, step: int, metrics: dict, prefix: str = "") -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [
            Metric(_key(prefix + k), float(v), now, step)
            for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        for i in range(0, len(items), 500):
            self.c.log_batch(self.run_id, metrics=items[i : i + 500])

    def tag(self, key: str, value) -> None:
        self.c.set_tag(self.run_id, key, str(value))

    def dataset(self, uri: str, name: str, digest: str | None, context: str) -> None:
        """A dataset this stage read (`context`: "training", "evaluation"), by URI and digest."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        source = json.dumps({"uri": uri})
        ds = Dataset(
            name=name,
            digest=digest or "-",
            source_type="s3" if uri.startswith("s3://") else "local",
            source=source,
        )
        self.c.log_inputs(
            self.run_id, [DatasetInput(ds, [InputTag("mlflow.data.context", context)])]
        )

    def output(self, uri: str, name: str, digest: str) -> None:
        """A dataset this stage wrote (the `OUTPUT` tag); the stage that reads it logs it as
        its input under the same name."""
        self.tag(OUTPUT + name, json.dumps({"uri": uri, "digest": digest}))

    def artifact(self, uri: str, artifact_path: str | None = None) -> None:
        from rstar.storage import filesystem, is_remote

        if not is_remote(uri):
            self.c.log_artifact(self.run_id, uri, artifact_path)
            return
        fs, path = filesystem(uri)
        with tempfile.TemporaryDirectory() as d:
            local = os.path.join(d, os.path.basename(path))
            fs.get_file(path, local)
            self.c.log_artifact(self.run_id, local, artifact_path)

    def curves(self, history: list[dict], keys: list[str], filename: str) -> None:
        """Training curves as one PNG artifact: a panel per metric over steps."""
        if not history:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = [k for k in keys if any(k in h for h in history)]
        fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 2.8), squeeze=False)
        for ax, k in zip(axes[0], keys):
            ax.plot(
                [h["step"] for h in history], [h.get(k, float("nan")) for h in history], marker="."
            )
            ax.set_title(k, fontsize=9)
            ax.set_xlabel("step")
        fig.tight_layout()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, filename)
            fig.savefig(path, dpi=100)
            self.c.log_artifact(self.run_id, path, "curves")
        plt.close(fig)


class NullLog:
    """StageLog's interface, recording nothing (stages run outside a pipeline)."""

    def metrics(self, *a, **k) -> None: ...
    def tag(self, *a, **k) -> None: ...
    def dataset(self, *a, **k) -> None: ...
    def output(self, *a, **k) -> None: ...
    def artifact(self, *a, **k) -> None: ...
    def curves(self, *a, **k) -> None: ...


# the alias a pipeline run gives its final model once evaluated: what the nightly job evaluates
LATEST_EVALUATED = "latest-evaluated"


def tag_version(tracking_uri: str, version: str, key: str, value: str) -> None:
    """Tag the model version `version` ("name/number")."""
    name, number = version.rsplit("/", 1)
    client(tracking_uri).set_model_version_tag(name, number, key, value)


def set_alias(tracking_uri: str, version: str, alias: str) -> None:
    """Point `alias` of the registered model at `version` ("name/number")."""
    name, number = version.rsplit("/", 1)
    client(tracking_uri).set_registered_model_alias(name, alias, number)


def register(
    tracking_uri: str,
    model_name: str,
    source: str,
    run_id: str,
    stage: str,
    digest: str,
    input_model: str | None,
) -> str:
    """Register a stage's model as a new version of `model_name`; returns "name/version"."""
    from mlflow.exceptions import MlflowException

    c = client(tracking_uri)
    try:
        c.create_registered_model(
            model_name,
            description=(
                "Checkpoints of an rstar recipe: one version per stage that makes a model, "
                f"tagged {STAGE} (base, sft, rl1-rl3) and {INPUT_MODEL} (the version it started "
                f"from); a run that evaluated a version carries the tag {EVALUATES}.<name>/"
                "<version> (`rstar lineage` reads them)."
            ),
        )
    except MlflowException:
        pass  # already registered
    tags = {STAGE: stage, DIGEST: digest}
    if input_model:
        tags[INPUT_MODEL] = input_model
    tags[LOGGED_MODEL] = _log_model(c, run_id, stage, source, digest)
    mv = c.create_model_version(model_name, source=source, run_id=run_id, tags=tags)
    version = f"{model_name}/{mv.version}"
    c.set_logged_model_tags(tags[LOGGED_MODEL], {"rstar.model_version": version})
    return version


def _log_model(c, run_id: str, stage: str, source: str, digest: str) -> str:
    """The stage's checkpoint as an MLflow logged model, the output of its run: its signature
    (a problem in; the agent's response and answer out), where its files are, their digest.
    The files stay where they are: MLflow 3.17's registry links a version to a logged model only
    when the version's source is that model's own artifacts, which would copy every checkpoint
    into the artifact store (28 GB for a 14B one) or make `models:/<name>/<version>` download a
    stub; the version names it by the `LOGGED_MODEL` tag instead."""
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model, ModelSignature
    from mlflow.types import ColSpec, Schema

    experiment = c.get_run(run_id).info.experiment_id
    model = c.create_logged_model(
        experiment,
        name=stage,
        source_run_id=run_id,
        params={"stage": stage, "source": source, "digest": digest},
        model_type="rstar-agent-checkpoint",
    )
    signature = ModelSignature(
        inputs=Schema([ColSpec("string", "problem")]),
        outputs=Schema([ColSpec("string", "response"), ColSpec("string", "answer")]),
    )
    with tempfile.TemporaryDirectory() as d:
        Model(signature=signature, model_id=model.model_id).save(os.path.join(d, "MLmodel"))
        with open(os.path.join(d, "README.md"), "w") as f:
            f.write(
                f"The {stage} checkpoint of an rstar pipeline run: a Hugging Face model directory "
                f"at {source} (digest {digest}). It answers a math problem by reasoning and "
                "calling a Python tool through rstar's agent loop (`rstar rollout`).\n"
            )
        c.log_model_artifacts(model.model_id, d)
    c.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
    c.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=0)])
    return model.model_id
