"""The recipe's stages as plain functions: base model -> problems -> SFT -> RL stages, with
hard-sample mining before the last one -> evaluation.

Every stage reads its inputs from URIs, writes its outputs under the storage root, and
returns a small dict of URIs, content digests and headline metrics; nothing else passes
between stages. Prefect (tasks/) retries and caches them, Ray runs them where their
resources are, MLflow (rstar.tracking) records them: none of that is in here.
"""
from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import replace

from rstar.agent.format import save_style
from rstar.errors import NotRetryable
from rstar.pipeline.config import Recipe
from rstar.pipeline.progress import StepClock
from rstar.storage import atomic_write_text, dirs, filesystem, is_remote
from rstar.tracking.digest import digest
from rstar.tracking.mlflow_log import EVAL_LABEL

# In a verl stage's published model: where its last actor checkpoint (optimizer state) lies.
VERL_CHECKPOINT = "verl_actor_checkpoint.txt"


class Layout:
    """Where each stage's files live under the storage root."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") if is_remote(root) else os.path.abspath(root)

    def dataset(self, name: str) -> str:
        return f"{self.root}/datasets/{name}.parquet"

    def model(self, stage: str) -> str:
        return f"{self.root}/models/{stage}"

    def registered(self, stage: str, digest: str) -> str:
        """Where a registered version of a stage's model lies, never overwritten (dirs.snapshot)."""
        return f"{self.root}/registry/{stage}-{digest}"

    def trajectories(self, stage: str) -> str:
        return f"{self.root}/trajectories/stage={stage}"

    def reports(self, name: str) -> str:
        return f"{self.root}/reports/{name}"

    def work_uri(self, stage: str) -> str:
        """Where a stage's working directories (its trainer checkpoints) live under the root."""
        return f"{self.root}/work/{stage}"

    def work(self, stage: str) -> str:
        """The local copy of a stage's working directory."""
        return dirs.local_dir(self.work_uri(stage))


def _load(uri: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import torch

    path = dirs.pull(uri)
    if path is None:
        raise FileNotFoundError(f"no model stored at {uri}")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def _publish(uri: str, fill, style: str | None = None) -> str:
    """Store a finished model directory at `uri` atomically: `fill(tmp_dir)` writes it, then
    it replaces the old one whole (and is pushed, for a remote root). `style`: the prompt style
    it was trained with, stored beside it (`rstar eval` reads it back)."""
    def fill_with_style(tmp: str) -> None:
        fill(tmp)
        if style:
            save_style(tmp, style)

    dirs.replace_dir(dirs.local_dir(uri), fill_with_style)
    dirs.push(uri)
    return uri


def _save(model, tokenizer, uri: str, style: str | None = None) -> str:
    def fill(tmp: str) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return _publish(uri, fill, style)


def _model_output(uri: str, stage: str, metrics: dict) -> dict:
    return {"model": uri, "model_digest": digest(dirs.pull(uri)), "stage": stage, "metrics": metrics}


def _progress(log, clock: StepClock, step: int, metrics: dict) -> None:
    log.metrics(step, metrics, prefix=f"{clock.label}/")
    clock.tick(step, f"loss {metrics['loss']:.3f}")


def _copy_probe(model, tokenizer, log, recipe: Recipe, *, chat: bool) -> dict:
    """Greedy copying probes (rstar.eval.copying), logged as copy_*: the first thing to look at
    when accuracy is low, since every solution copies numbers twice."""
    from rstar.eval.copying import copy_probe

    scores = {f"copy_{k}": v for k, v in copy_probe(model, tokenizer, chat=chat,
                                                   prompt_style=recipe.prompt_style).items()}
    log.metrics(0, scores)
    return scores


# -- stages -----------------------------------------------------------------------------------
def base(recipe: Recipe, layout: Layout, inputs: dict, log) -> dict:
    """The model SFT starts from: the tiny base shipped with the project (checked against its
    manifest), built and pretrained here, or taken from a path/hub name."""
    spec = recipe.base
    if not spec.build_tiny:
        return _model_output(_publish(layout.model("base"), lambda tmp: _copy_base(spec.path, tmp)), "base", {})
    if spec.shipped:
        from rstar.model.shipped import MANIFEST, check_shipped

        manifest = check_shipped(os.path.abspath(spec.shipped), spec)
        log.tag("rstar.base_shipped", f"{spec.shipped} digest {manifest['digest']} built {manifest['built']} "
                                      f"on {manifest['cpu']}")
        uri = _publish(layout.model("base"), lambda tmp: shutil.copytree(
            os.path.abspath(spec.shipped), tmp, ignore=shutil.ignore_patterns(MANIFEST)))
        model, tok = _load(uri)
        copying = _copy_probe(model, tok, log, recipe, chat=False)
        return _model_output(uri, "base", copying)  # its model_digest is the manifest's digest
    from rstar.model.shipped import pretrain_base

    clock = StepClock(spec.pretrain_steps, "pretrain", every=50)
    model, tok, history = pretrain_base(spec, on_step=lambda s, m: _progress(log, clock, s, m))
    copying = _copy_probe(model, tok, log, recipe, chat=False)
    return _model_output(_save(model, tok, layout.model("base")), "base",
                         {"pretrain_loss": history[-1]["loss"] if history else None,
                          "parameters": sum(p.numel() for p in model.parameters()), **copying})


def _copy_base(path: str, out: str) -> None:
    """A Hugging Face model's files (a local directory or a hub name) copied as they are, never
    loaded (a 14B base in this process would need its whole weight in RAM), with the
    rStar2-Agent chat template, identical in HF, vLLM and verl, set on its tokenizer."""
    from transformers import AutoTokenizer

    from rstar.agent.format import CHAT_TEMPLATE

    if not os.path.isdir(path):
        from huggingface_hub import snapshot_download

        path = snapshot_download(path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"])
    shutil.copytree(path, out)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)


def problems(recipe: Recipe, layout: Layout, inputs: dict, log) -> dict:
    """Training and held-out problems (synthetic, or curated from files, decontaminated
    against the held-out set)."""
    from rstar.data import synth
    from rstar.data.curate import SourceSpec, curate, write_report
    from rstar.data.io import read_table, write_table

    out = {}
    for name in ("eval", "train"):  # eval first: training problems are decontaminated against it
        spec = recipe.eval_problems if name == "eval" else recipe.train_problems
        path = layout.dataset(f"{name}_problems")
        held_out = [r["problem"] for r in read_table(out["eval"], "problems").to_pylist()] if name == "train" else []
        if spec.synthetic:
            s = spec.synthetic
            rows = synth.generate(s.n, seed=s.seed, levels=tuple(s.levels), families=s.families, prefix=name)
            excluded = set(held_out)
            rows = [r for r in rows if r["problem"] not in excluded]
            write_table(rows, path, "problems")
            kept = len(rows)
        else:
            report = curate([SourceSpec.parse(f) for f in spec.files], path, layout.dataset(f"{name}_rejects"),
                            eval_problems=held_out)
            write_report(report, layout.reports(f"curation_{name}.json"))
            kept = report.kept
        out[name] = path
        out[f"{name}_digest"] = digest(path)
        out[f"{name}_rows"] = kept
    log.dataset(out["train"], "train_problems", out["train_digest"], context="output")
    log.dataset(out["eval"], "eval_problems", out["eval_digest"], context="output")
    return {**out, "metrics": {"train_problems": out["train_rows"], "eval_problems": out["eval_rows"]}}


def sft(recipe: Recipe, layout: Layout, inputs: dict, log) -> dict:
    """Non-reasoning SFT of the base model on generated tool-use chats."""
    from rstar.data import sft as sft_data
    from rstar.data.io import write_table
    from rstar.train.sft import train_sft

    spec = recipe.sft
    rows = [r for f in spec.files for r in sft_data.load_sft(f)] if spec.files else \
        sft_data.generate(spec.examples, seed=spec.seed, tasks=spec.tasks)
    data = write_table(rows, layout.dataset("sft"), "sft")
    log.dataset(data, "sft_chats", digest(data), context="training")
    cfg = replace(spec.train, prompt_style=recipe.prompt_style)
    if recipe.engine == "verl":
        return _sft_verl(recipe, layout, inputs, log, cfg, data)
    model, tok = _load(inputs["model"])
    clock = StepClock(cfg.epochs * -(-len(rows) // cfg.batch_size), "sft", every=50)
    history = train_sft(model, tok, rows, cfg, on_step=lambda s, m: _progress(log, clock, s, m))
    log.curves(history, ["loss", "lr", "grad_norm"], "sft_curves.png")
    copying = _copy_probe(model, tok, log, recipe, chat=True)
    return _model_output(_save(model, tok, layout.model("sft"), recipe.prompt_style), "sft",
                         {"final_loss": history[-1]["loss"], **copying})


def _sft_verl(recipe: Recipe, layout: Layout, inputs: dict, log, cfg, data: str) -> dict:
    """The cluster path: verl's Ray SFT trainer (rstar.train.verl_sft) over the recipe's GPUs, or
    on this machine's CPU with `resources.gpus: 0`; its last checkpoint merged into a Hugging
    Face directory. verl resumes from its checkpoint of the last finished epoch after a retry."""
    from rstar.train.verl_sft import last_checkpoint, sft_command

    work, _ = _work_dir(recipe, layout, "sft", inputs)
    os.makedirs(work, exist_ok=True)
    device = "gpu" if recipe.resources.gpus else "cpu"
    cmd = sft_command(cfg, model=dirs.pull(inputs["model"]), train_files=data, out_dir=work,
                      n_gpus=int(recipe.resources.gpus) or 1, nodes=recipe.resources.nodes,
                      experiment=recipe.tracking.experiment, device=device)
    merged = _run_verl_job(cmd, "sft", log, work, device, int(recipe.resources.cpus), lambda: last_checkpoint(work))
    copying = {}
    if recipe.base.build_tiny:  # the copy probes are the tiny model's diagnostic; a real one is never loaded here
        copying = _copy_probe(*_load(merged), log, recipe, chat=True)
    return _model_output(_publish(layout.model("sft"), lambda tmp: shutil.copytree(merged, tmp), recipe.prompt_style),
                         "sft", copying)


def resumes(recipe: Recipe, stage: str) -> bool:
    """Whether `stage` continues from checkpoints in its working directory after a retry or a
    kill: the RL stages, and SFT on verl (the local SFT and the other stages start over)."""
    return stage in {s.name for s in recipe.rl} or (stage == "sft" and recipe.engine == "verl")


def work_uri(recipe: Recipe, stage: str, inputs: dict) -> str:
    """The URI of a stage's working directory for this recipe and these inputs."""
    return f"{Layout(recipe.storage_root).work_uri(stage)}/{recipe.cache_key(stage, inputs)}"


def _work_dir(recipe: Recipe, layout: Layout, stage: str, inputs: dict) -> tuple[str, str]:
    """A stage's working directory (local, and its URI under the root) for this recipe and
    these inputs: a retry resumes from the checkpoints it finds there; a run of another recipe
    or from another input model never does. Other runs' directories are removed from storage
    (local or remote), so stale checkpoints do not pile up."""
    uri = work_uri(recipe, stage, inputs)
    run = uri.rsplit("/", 1)[-1]
    fs, parent = filesystem(layout.work_uri(stage))
    if fs.exists(parent):
        for path in fs.ls(parent, detail=False):
            if path.rstrip("/").rsplit("/", 1)[-1] != run:
                fs.rm(path, recursive=True)
    return dirs.local_dir(uri), uri


def rl(recipe: Recipe, layout: Layout, inputs: dict, log, *, stage: str) -> dict:
    """One GRPO-RoC stage, resumable: an interrupted run continues from its last checkpoint
    (in the stage's working directory, or the one last pushed to remote storage)."""
    from rstar.data.io import read_table
    from rstar.sandbox.service import embedded_sandbox
    from rstar.train.rl import RLTrainer

    cfg = next(s for s in recipe.rl if s.name == stage)
    work, remote_work = _work_dir(recipe, layout, stage, inputs)
    if recipe.engine == "verl":
        return _rl_verl(recipe, layout, inputs, log, cfg, work)
    ckpt_uri = f"{remote_work}/checkpoint"
    if is_remote(layout.root):
        # For a remote root the local directory is scratch: resume only from what storage
        # holds (pushed every step), never from whatever an older run left on this machine.
        shutil.rmtree(work, ignore_errors=True)
        pulled = dirs.pull(ckpt_uri)
        if pulled:
            shutil.copytree(pulled, os.path.join(work, "checkpoint"))
    if not os.path.exists(os.path.join(work, "checkpoint")):  # a fresh start: drop other runs' step files
        fs, path = filesystem(layout.trajectories(stage))
        if fs.exists(path):
            fs.rm(path, recursive=True)
    init = dirs.pull(inputs["model"])
    cfg = replace(cfg, init_from=init, prompt_style=recipe.prompt_style)
    rows = read_table(inputs["problems"], ("problems", "hard_problems")).to_pylist()
    log.dataset(inputs["problems"], "rl_problems", inputs.get("problems_digest"), context="training")
    model, tok = _load(inputs["model"])

    clock = StepClock(cfg.steps, stage)

    def on_step(step: int, metrics: dict) -> None:
        log.metrics(step, metrics, prefix=f"{stage}/")
        clock.tick(step, f"accuracy {metrics['accuracy']:.3f} tool errors {metrics['tool_error_rate']:.3f} "
                         f"(in correct {metrics['tool_error_rate_positive']:.3f}) "
                         f"length {metrics['response_len_mean']:.0f}")

    def on_checkpoint(step: int) -> None:
        dirs.push(ckpt_uri, os.path.join(work, "checkpoint"))  # for a remote root: a new version

    async def main():
        async with embedded_sandbox() as sb:
            trainer = RLTrainer(model, tok, rows, sb, cfg, work, on_step=on_step, on_checkpoint=on_checkpoint,
                                trajectories=layout.trajectories(stage))
            return await trainer.run(), trainer

    history, trainer = asyncio.run(main())
    log.tag("rstar.started_as", trainer.started_as)  # "resumed" after a retry picked up a checkpoint
    log.curves(history, ["accuracy", "tool_error_rate", "tool_error_rate_positive", "response_len_mean"],
               f"{stage}_curves.png")
    log.dataset(layout.trajectories(stage), f"{stage}_trajectories", digest(layout.trajectories(stage)),
                context="output")
    last = history[-1] if history else {}
    # The stage's model is its last checkpoint, trainer state included, so the next stage can
    # carry the AdamW moments over (unless it resets them).
    final = _publish(layout.model(stage), lambda tmp: shutil.copytree(os.path.join(work, "checkpoint"), tmp),
                     recipe.prompt_style)
    # training accuracy at the start and the end of the stage, so its summary shows whether it rose
    ends = {f"accuracy_{name}_{len(part)}_steps": sum(h["accuracy"] for h in part) / len(part)
            for name, part in (("first", history[:5]), ("last", history[-5:])) if part}
    return {**_model_output(final, stage,
                            {**ends, **{k: last.get(k) for k in ("accuracy", "tool_error_rate", "tool_error_rate_positive",
                                                                 "tool_error_rate_positive_kept", "response_len_mean")}}),
            "trajectories": layout.trajectories(stage), "steps": len(history)}


def _rl_verl(recipe: Recipe, layout: Layout, inputs: dict, log, cfg, work: str) -> dict:
    """The cluster path: verl's trainer on the Ray cluster (FSDP actor, vLLM rollouts, this
    project's agent loop, tool, reward and RoC), then its last FSDP checkpoint merged into a
    Hugging Face directory by verl's model merger. verl resumes from its own checkpoints after a
    retry. With `resources.gpus: 0` the same trainer runs on this machine's CPU (one training
    process, the HF engine as rollout; rstar.train.verl_cpu)."""
    import contextlib

    from rstar.sandbox.client import check_health
    from rstar.sandbox.process import SandboxProcess

    device = "gpu" if recipe.resources.gpus else "cpu"
    with contextlib.ExitStack() as stack:
        # on the CPU without a sandbox service named, one of its own for this stage (loopback only)
        sandbox_url = recipe.sandbox_url or stack.enter_context(SandboxProcess()).url
        # a sandbox that does not answer would turn every tool call into an error and train on that
        check_health(sandbox_url)
        return _run_verl(recipe, layout, inputs, log, cfg, work, device, sandbox_url)


def _run_verl(recipe: Recipe, layout: Layout, inputs: dict, log, cfg, work: str, device: str, sandbox_url: str) -> dict:
    from rstar.train.verl_launcher import build_verl_run

    held_out = layout.dataset("eval_problems")
    fs, path = filesystem(held_out)
    model = dirs.pull(inputs["model"])
    # the previous verl stage's optimizer state, which this one carries over unless it resets
    pointer = os.path.join(model, VERL_CHECKPOINT)
    optimizer_from = open(pointer).read().strip() if os.path.exists(pointer) else None
    cmd = build_verl_run(replace(cfg, prompt_style=recipe.prompt_style), model=model,
                         problems=inputs["problems"], sandbox_url=sandbox_url, out_dir=work,
                         n_gpus=int(recipe.resources.gpus) or 1, nodes=recipe.resources.nodes,
                         val_problems=held_out if fs.exists(path) else None, experiment=recipe.tracking.experiment,
                         optimizer_from=optimizer_from, device=device)
    actor = os.path.join(work, f"global_step_{cfg.steps}", "actor")
    merged = _run_verl_job(cmd, cfg.name, log, work, device, int(recipe.resources.cpus), lambda: actor)
    with open(os.path.join(merged, VERL_CHECKPOINT), "w") as f:
        f.write(actor)
    final = _publish(layout.model(cfg.name), lambda tmp: shutil.copytree(merged, tmp), recipe.prompt_style)
    return _model_output(final, cfg.name, {})


def _run_verl_job(cmd: list[str], stage: str, log, work: str, device: str, threads: int, checkpoint) -> str:
    """Run a verl command for `stage` in its work directory (`threads`: torch threads per process
    on the CPU), then merge the FSDP checkpoint `checkpoint()` names into `work/hf` with verl's
    model merger; return that directory."""
    import subprocess

    from rstar.train.verl_launcher import merge_command, verl_env

    log.tag("rstar.verl_command", " ".join(cmd)[:5000])
    # verl's MLflow logger writes into this stage's run, beside the pipeline's own metrics
    run_id = getattr(log, "run_id", None)
    mlflow_env = {"MLFLOW_TRACKING_URI": log.tracking_uri, "MLFLOW_RUN_ID": run_id} if run_id else {}
    print(f"[{stage}] verl ({device}): {' '.join(cmd[:3])} ...", flush=True)
    env = {**os.environ, **verl_env(device, threads), **mlflow_env}
    if device == "cpu":
        env.pop("RAY_ADDRESS", None)  # verl on the CPU starts a Ray of its own, with its training slots
    else:  # verl joins the Ray this stage runs on (the cluster), where its GPUs are
        import ray

        if ray.is_initialized():
            env.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)
    subprocess.run(cmd, check=True, env=env, cwd=work)  # Hydra's outputs/ land in the work directory
    merged = os.path.join(work, "hf")
    subprocess.run(merge_command(checkpoint(), merged), check=True, env=env)
    return merged


def serving(recipe: Recipe) -> dict:
    """How a sampling stage (mining, evaluation) serves its model: in this process for the
    embedded recipe; with `engine: verl`, as engine replicas behind the balanced scheduler
    (vLLM, one per GPU of the recipe's nodes; on the CPU, two HF replicas) and the recipe's
    sandbox service (rstar.rollout.open)."""
    if recipe.engine != "verl":
        return {}
    if recipe.resources.gpus:
        return {"replicas": int(recipe.resources.gpus) * recipe.resources.nodes, "kind": "vllm",
                "sandbox_url": recipe.sandbox_url}
    return {"replicas": 2, "kind": "hf", "sandbox_url": recipe.sandbox_url}


def _rollout_clock(label: str, rollouts: int) -> StepClock:
    """Progress of a sampling stage, counted in rollouts (printed at each quarter when piped)."""
    return StepClock(rollouts, label, every=max(1, rollouts // 4), unit="rollouts")


def mine(recipe: Recipe, layout: Layout, inputs: dict, log) -> dict:
    """Problems the given policy does not solve k/k: the training set of the last stage."""
    from rstar.agent.loop import LoopConfig
    from rstar.data.io import read_table, write_json, write_table
    from rstar.data.mine import mine_hard
    from rstar.rollout.open import open_agent_loop
    from rstar.rollout.runner import rollout

    spec = recipe.mine
    rows = read_table(inputs["problems"], "problems").to_pylist()[: spec.problems]
    loop_cfg = LoopConfig(max_turns=spec.max_turns, max_response_tokens=spec.max_response_tokens,
                          temperature=spec.temperature, prompt_style=recipe.prompt_style)

    clock = _rollout_clock("mine", len(rows) * spec.k)

    async def main():
        async with open_agent_loop(dirs.pull(inputs["model"]), loop_cfg, **serving(recipe)) as loop:
            return await rollout(loop, rows, spec.k, stage="mine", progress=clock.advance)

    hard, report = mine_hard(rows, asyncio.run(main()), k=spec.k)
    path = write_table(hard, layout.dataset("hard_problems"), "hard_problems")
    write_json(report.to_dict(), layout.reports("mining.json"))
    hard_digest = digest(path)
    log.dataset(path, "hard_problems", hard_digest, context="output")
    return {"problems": path, "problems_digest": hard_digest, "metrics": report.to_dict()}


def evaluate(recipe: Recipe, layout: Layout, inputs: dict, log) -> dict:
    """Every model in `inputs["models"]` ({name: uri}) on the held-out problems, side by side."""
    from rstar.data.io import read_table, write_json, write_table
    from rstar.eval.report import write_report
    from rstar.eval.run import evaluate_model, markdown_table
    from rstar.pipeline.verdict import verdict

    problems_ = read_table(inputs["problems"], "problems").to_pylist()
    out_dir = layout.reports(inputs.get("report_name", "eval"))
    # what lineage shows of this evaluation: its label and held-out set (its settings are the run's params)
    log.tag(EVAL_LABEL, inputs.get("report_name", "eval"))
    log.dataset(inputs["problems"], "eval_problems", inputs.get("problems_digest") or digest(inputs["problems"]),
                context="evaluation")
    summaries = {}
    for name, uri in inputs["models"].items():
        path, expected = dirs.pull(uri), inputs.get("digests", {}).get(name)
        if expected and (found := digest(path)) != expected:  # e.g. a registered version's files, changed since
            raise NotRetryable(f"{name}: the files at {uri} have digest {found}, not the {expected} they were "
                               "registered with")
        clock = _rollout_clock(f"eval/{name}", len(problems_) * recipe.eval.k)
        records, summaries[name] = evaluate_model(path, problems_, recipe.eval, prompt_style=recipe.prompt_style,
                                                  name=name, progress=clock.advance, **serving(recipe))
        write_table(records, f"{out_dir}/{name}.samples.parquet", "trajectories")
    write_json(summaries, f"{out_dir}/summary.json")
    # The recipe's verdict when these are its checkpoints (SFT, then RL stages), not a re-evaluation's pick
    recipe_order = ["sft"] + [r.name for r in recipe.rl]
    learnt, lines = verdict(summaries, recipe.expect, inputs.get("copying")) \
        if list(summaries) == recipe_order else (None, [])
    paths = write_report(summaries, recipe.eval.k, out_dir)
    for p in paths:
        log.artifact(p)
    flat = {f"{name}/{bench}/{key}": value for name, s in summaries.items() for bench, m in s.items()
            for key, value in m.items() if isinstance(value, (int, float))}
    log.metrics(0, flat, prefix="eval/")
    if learnt is not None:
        log.tag("rstar.learnt", str(learnt).lower())
    return {"report": out_dir, "summaries": summaries, "table": markdown_table(summaries, recipe.eval.k),
            "learnt": learnt, "verdict": lines, "metrics": {k: v for k, v in flat.items() if k.endswith("avg_pass@1")}}


def _marker(recipe: Recipe, stage: str, inputs: dict) -> str:
    name = f"{stage}-{inputs['report_name']}" if "report_name" in inputs else stage
    return f"{Layout(recipe.storage_root).root}/cache/{name}.key"


def outputs_exist(recipe: Recipe, stage: str, inputs: dict) -> bool:
    """Whether a stage's outputs are still in storage, as this recipe and these inputs made
    them (a cached result is only reused if so). A run with another recipe at the same root
    overwrites the outputs and the marker naming what made them, so its result never passes
    for this one's."""
    layout = Layout(recipe.storage_root)
    paths = {"problems": [layout.dataset("train_problems"), layout.dataset("eval_problems")],
             "mine": [layout.dataset("hard_problems")],
             "evaluate": [f"{layout.reports(inputs.get('report_name', 'eval'))}/summary.json"]}.get(stage)
    if paths is None:  # a model stage
        paths = [f"{layout.model(stage)}/{dirs.POINTER}" if is_remote(layout.root) else
                 os.path.join(layout.model(stage), "config.json")]
    fs, _ = filesystem(paths[0])
    if not all(fs.exists(filesystem(p)[1]) for p in paths):
        return False
    fs, marker = filesystem(_marker(recipe, stage, inputs))
    return fs.exists(marker) and fs.cat_file(marker).decode() == recipe.cache_key(stage, inputs)


STAGES = {"base": base, "problems": problems, "sft": sft, "mine": mine, "evaluate": evaluate}


def run(stage: str, recipe: Recipe, inputs: dict, log) -> dict:
    """Run one stage by name (RL stages by their recipe names)."""
    layout = Layout(recipe.storage_root)
    if stage in STAGES:
        out = STAGES[stage](recipe, layout, inputs, log)
    elif stage in {s.name for s in recipe.rl}:
        out = rl(recipe, layout, inputs, log, stage=stage)
    else:
        raise ValueError(f"unknown stage {stage!r}")
    atomic_write_text(_marker(recipe, stage, inputs), recipe.cache_key(stage, inputs))
    return out


def summary_markdown(stage: str, out: dict, links: dict) -> str:
    """The per-stage Prefect artifact: key metrics and where to look."""
    lines = [f"# {stage}", "", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |"
              for k, v in (out.get("metrics") or {}).items()]
    lines += ["", *(f"- {k}: `{v}`" for k, v in links.items())]
    if "table" in out:
        lines += ["", out["table"]]
    if out.get("verdict"):
        lines += ["", "## Did it learn?", "", *(f"- {line}" for line in out["verdict"])]
    return "\n".join(lines) + "\n"
