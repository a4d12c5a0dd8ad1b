"""The recipe's stages as plain functions: base model -> problems -> SFT -> RL stages, with
hard-sample mining before the last one -> evaluation.

Every stage reads its inputs from URIs (`StageInputs`), writes its outputs under the storage
root (`Layout`), and returns a `StageOutput` of URIs, content digests and headline metrics;
nothing else passes between stages (rstar.pipeline.records). Prefect (tasks/) retries and
caches them, Ray runs them where their resources are, MLflow (rstar.tracking) records them:
none of that is in here. With `engine: verl`, SFT and RL run verl's own trainers
(rstar.pipeline.verl_stages).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from dataclasses import replace
from pathlib import PurePosixPath

from rstar.errors import NotRetryable
from rstar.pipeline import cache, verl_stages
from rstar.pipeline.config import Recipe
from rstar.pipeline.layout import Layout
from rstar.pipeline.progress import StepClock
from rstar.pipeline.publish import load, model_output, publish, save
from rstar.pipeline.records import Evaluation, StageInputs, StageOutput, Stored
from rstar.pipeline.stage_table import find
from rstar.storage import dirs, filesystem, is_remote, remove_tree
from rstar.tracking.digest import digest
from rstar.tracking.mlflow_log import EVAL_LABEL
from rstar.train.metrics import namespaced

logger = logging.getLogger(__name__)


def _progress(log, clock: StepClock, step: int, metrics: dict) -> None:
    log.metrics(step, metrics, prefix=f"{clock.label}/")
    clock.tick(step, f"loss {metrics['loss']:.3f}")


def _copy_probe(model, tokenizer, log, recipe: Recipe, *, chat: bool) -> dict:
    """Greedy copying probes (rstar.eval.copying), logged as copy_*: the first thing to look at
    when accuracy is low, since every solution copies numbers twice."""
    from rstar.eval.copying import copy_probe

    scores = {
        f"copy_{k}": v
        for k, v in copy_probe(
            model, tokenizer, chat=chat, prompt_style=recipe.prompt_style
        ).items()
    }
    log.metrics(0, scores)
    return scores


# -- the model SFT starts from ----------------------------------------------------------------
def base(recipe: Recipe, layout: Layout, inputs: StageInputs, log) -> StageOutput:
    """The model SFT starts from: the tiny base shipped with the project (checked against its
    manifest), built and pretrained here, converted from a GGUF file, or taken from a path/hub
    name."""
    spec = recipe.base
    if spec.gguf:
        from rstar.model.gguf import convert

        made: dict = {}
        uri = publish(layout.model("base"), lambda tmp: made.update(convert(spec.gguf, tmp)))
        log.tag("rstar.base_gguf", f"{spec.gguf} sha256 {made['sha256']} ({made['architecture']})")
        return model_output(uri, "base", {"parameters": made["parameters"]})
    if not spec.build_tiny:
        return model_output(
            publish(layout.model("base"), lambda tmp: _copy_base(spec.path, tmp)), "base", {}
        )
    if spec.shipped:
        from rstar.model.shipped import MANIFEST, check_shipped

        manifest = check_shipped(os.path.abspath(spec.shipped), spec)
        log.tag(
            "rstar.base_shipped",
            f"{spec.shipped} digest {manifest['digest']} built {manifest['built']} on "
            f"{manifest['cpu']}",
        )
        uri = publish(
            layout.model("base"),
            lambda tmp: shutil.copytree(
                os.path.abspath(spec.shipped), tmp, ignore=shutil.ignore_patterns(MANIFEST)
            ),
        )
        model, tok = load(uri)
        copying = _copy_probe(model, tok, log, recipe, chat=False)
        return model_output(uri, "base", copying)  # its model digest is the manifest's digest
    from rstar.model.shipped import pretrain_base

    clock = StepClock(spec.pretrain_steps, "pretrain", every=50)
    model, tok, history = pretrain_base(spec, on_step=lambda s, m: _progress(log, clock, s, m))
    copying = _copy_probe(model, tok, log, recipe, chat=False)
    return model_output(
        save(model, tok, layout.model("base")),
        "base",
        {
            "pretrain_loss": history[-1]["loss"] if history else None,
            "parameters": sum(p.numel() for p in model.parameters()),
            **copying,
        },
    )


def _copy_base(path: str, out: str) -> None:
    """A Hugging Face model's files (a local directory or a hub name) copied as they are, never
    loaded (a 14B base in this process would need its whole weight in RAM), with the
    rStar2-Agent chat template, identical in HF, vLLM and verl, set on its tokenizer."""
    from transformers import AutoTokenizer

    from rstar.model.gguf import chatml_tokenizer

    if not os.path.isdir(path):
        from huggingface_hub import snapshot_download

        path = snapshot_download(
            path, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
        )
    shutil.copytree(path, out)
    chatml_tokenizer(AutoTokenizer.from_pretrained(path), path).save_pretrained(out)


# -- data --------------------------------------------------------------------------------------
def problems(recipe: Recipe, layout: Layout, inputs: StageInputs, log) -> StageOutput:
    """Training and held-out problems (synthetic, or curated from files, decontaminated
    against the held-out set). Held-out benchmarks are kept as published, answers of any form
    (MATH-500's expressions, GPQA's letters, scored by math-verify): only unreadable, duplicate
    and over-long rows go; the integer-answer filter is for training problems unless the
    recipe says otherwise (`integer_answers`). Each curation's report, per source, is logged."""
    from rstar.data import synth
    from rstar.data.curate import CurationConfig, SourceSpec, curate, write_report
    from rstar.data.io import read_table, write_table
    from rstar.eval.benchmarks import load_benchmark

    made: dict[str, Stored] = {}
    rows_kept = {}
    for name in ("eval", "train"):  # eval first: training problems are decontaminated against it
        spec = recipe.eval_problems if name == "eval" else recipe.train_problems
        path = layout.dataset(f"{name}_problems")
        held_out = (
            [r["problem"] for r in read_table(made["eval"].uri, "problems").to_pylist()]
            if name == "train"
            else []
        )
        if spec.synthetic:
            s = spec.synthetic
            rows = synth.generate(
                s.n, seed=s.seed, levels=s.levels, families=s.families, prefix=name
            )
            excluded = set(held_out)
            rows = [r for r in rows if r["problem"] not in excluded]
            write_table(rows, path, "problems")
            rows_kept[name] = len(rows)
        else:
            rows_kept[name] = 0
            if spec.files:
                report = curate(
                    [SourceSpec.parse(f) for f in spec.files],
                    path,
                    layout.dataset(f"{name}_rejects"),
                    eval_problems=held_out,
                    cfg=CurationConfig(
                        integer_only=name == "train"
                        if spec.integer_answers is None
                        else spec.integer_answers
                    ),
                )
                log.artifact(write_report(report, layout.reports(f"curation_{name}.json")))
                for line in report.format().splitlines():
                    logger.info("%s problems: %s", name, line)
                rows_kept[name] = report.kept
            if spec.benchmarks:  # held out, as published (rstar.eval.benchmarks)
                rows = read_table(path, "problems").to_pylist() if spec.files else []
                rows += [r for b, src in spec.benchmarks.items() for r in load_benchmark(b, src)]
                write_table(rows, path, "problems")
                rows_kept[name] = len(rows)
        made[name] = Stored(path, digest(path))
    for name in ("train", "eval"):
        log.output(made[name].uri, f"{name}_problems", made[name].digest)
    kept = {"train_problems": rows_kept["train"], "eval_problems": rows_kept["eval"]}
    log.metrics(0, kept)
    return StageOutput(
        "problems",
        kept,
        datasets={"train": made["train"], "eval": made["eval"]},
    )


# -- training ----------------------------------------------------------------------------------
def sft(recipe: Recipe, layout: Layout, inputs: StageInputs, log) -> StageOutput:
    """Non-reasoning SFT of the base model on generated tool-use chats (or chat files)."""
    from rstar.data import sft as sft_data
    from rstar.data.io import write_table
    from rstar.train.sft import train_sft

    spec = recipe.sft
    rows = (
        [r for f in spec.files for r in sft_data.load_sft(f)]
        if spec.files
        else sft_data.generate(spec.examples, seed=spec.seed, tasks=spec.tasks)
    )
    data = write_table(rows, layout.dataset("sft"), "sft")
    log.dataset(data, "sft_chats", digest(data), context="training")
    if recipe.engine == "verl":
        merged = verl_stages.sft(recipe, inputs, log, data)
        copying = {}
        # the copy probes are the tiny model's diagnostic; a real one is never loaded here
        if recipe.base.build_tiny:
            copying = _copy_probe(*load(merged), log, recipe, chat=True)
        return model_output(
            publish(
                layout.model("sft"), lambda tmp: shutil.copytree(merged, tmp), recipe.prompt_style
            ),
            "sft",
            copying,
        )
    cfg = replace(spec.train, prompt_style=recipe.prompt_style)
    model, tok = load(inputs.model.uri)
    clock = StepClock(cfg.epochs * -(-len(rows) // cfg.batch_size), "sft", every=50)
    history = train_sft(model, tok, rows, cfg, on_step=lambda s, m: _progress(log, clock, s, m))
    log.curves(history, ["loss", "lr", "grad_norm"], "sft_curves.png")
    copying = _copy_probe(model, tok, log, recipe, chat=True) if recipe.base.build_tiny else {}
    return model_output(
        save(model, tok, layout.model("sft"), recipe.prompt_style),
        "sft",
        {"final_loss": history[-1]["loss"], **copying},
    )


def rl(recipe: Recipe, layout: Layout, inputs: StageInputs, log, *, stage: str) -> StageOutput:
    """One GRPO-RoC stage, resumable: an interrupted run continues from its last checkpoint
    (in the stage's working directory, or the one last pushed to remote storage)."""
    from rstar.data.io import read_table
    from rstar.train.rl import train_from

    cfg = next(s for s in recipe.rl if s.name == stage)
    work, remote_work = cache.work_dir(recipe, stage, inputs)
    if recipe.engine == "verl":
        merged = verl_stages.rl(recipe, inputs, log, cfg, work)
        trajectories = layout.trajectories(stage)
        log.output(trajectories, f"{stage}_trajectories", digest(trajectories))
        return model_output(
            publish(
                layout.model(stage), lambda tmp: shutil.copytree(merged, tmp), recipe.prompt_style
            ),
            stage,
            {},
            trajectories=trajectories,
        )
    ckpt_uri = f"{remote_work}/checkpoint"
    if is_remote(layout.root):
        # For a remote root the local directory is scratch: resume only from what storage
        # holds (pushed every step), never from whatever an older run left on this machine.
        shutil.rmtree(work, ignore_errors=True)
        pulled = dirs.pull(ckpt_uri)
        if pulled:
            shutil.copytree(pulled, os.path.join(work, "checkpoint"))
    # a fresh start: drop other runs' step files
    if not os.path.exists(os.path.join(work, "checkpoint")):
        remove_tree(layout.trajectories(stage))
    cfg = replace(cfg, init_from=dirs.pull(inputs.model.uri), prompt_style=recipe.prompt_style)
    rows = read_table(inputs.problems.uri, ("problems", "hard_problems")).to_pylist()
    # under the name it was written with: train_problems, or the mined hard_problems for rl3
    log.dataset(
        inputs.problems.uri,
        PurePosixPath(inputs.problems.uri).stem,
        inputs.problems.digest,
        context="training",
    )
    clock = StepClock(cfg.steps, stage)

    def on_step(step: int, metrics: dict) -> None:
        log.metrics(step, namespaced(metrics))  # the names verl's stages log too
        clock.tick(
            step,
            f"accuracy {metrics['accuracy']:.3f} tool errors {metrics['tool_error_rate']:.3f} (in "
            f"correct {metrics['tool_error_rate_positive']:.3f}) length "
            f"{metrics['response_len_mean']:.0f}",
        )

    def on_checkpoint(step: int) -> None:
        dirs.push(ckpt_uri, os.path.join(work, "checkpoint"))  # for a remote root: a new version

    trainer = asyncio.run(
        train_from(
            cfg.init_from,
            rows,
            cfg,
            work,
            on_step,
            on_checkpoint=on_checkpoint,
            trajectories=layout.trajectories(stage),
        )
    )
    history = trainer.history
    # "resumed" after a retry picked up a checkpoint
    log.tag("rstar.started_as", trainer.started_as)
    log.curves(
        history,
        ["accuracy", "tool_error_rate", "tool_error_rate_positive", "response_len_mean"],
        f"{stage}_curves.png",
    )
    log.output(
        layout.trajectories(stage), f"{stage}_trajectories", digest(layout.trajectories(stage))
    )
    last = history[-1] if history else {}
    # The stage's model is its last checkpoint, trainer state included, so the next stage can
    # carry the AdamW moments over (unless it resets them).
    final = publish(
        layout.model(stage),
        lambda tmp: shutil.copytree(os.path.join(work, "checkpoint"), tmp),
        recipe.prompt_style,
    )
    # training accuracy at the start and the end of the stage, so its summary shows whether it rose
    ends = {
        f"accuracy_{name}_{len(part)}_steps": sum(h["accuracy"] for h in part) / len(part)
        for name, part in (("first", history[:5]), ("last", history[-5:]))
        if part
    }
    headline = (
        "accuracy",
        "tool_error_rate",
        "tool_error_rate_positive",
        "tool_error_rate_positive_kept",
        "response_len_mean",
    )
    return model_output(
        final,
        stage,
        {**ends, **{k: last.get(k) for k in headline}},
        trajectories=layout.trajectories(stage),
    )


# -- sampling: mining and evaluation -----------------------------------------------------------
def serving(recipe: Recipe) -> dict:
    """How a sampling stage (mining, evaluation) serves its model: in this process for the
    embedded recipe; with `engine: verl`, as vLLM engine replicas behind the balanced scheduler
    (one per GPU of the recipe's nodes; on the CPU, two of vLLM's CPU build) and the recipe's
    sandbox service (rstar.rollout.open)."""
    if recipe.engine != "verl":
        return {}
    replicas = int(recipe.resources.gpus) * recipe.resources.nodes or 2
    return {"replicas": replicas, "kind": "vllm", "sandbox_url": recipe.sandbox_url}


def _rollout_clock(label: str, rollouts: int) -> StepClock:
    """Progress of a sampling stage, counted in rollouts (logged at each quarter when piped)."""
    return StepClock(rollouts, label, every=max(1, rollouts // 4), unit="rollouts")


def mine(recipe: Recipe, layout: Layout, inputs: StageInputs, log) -> StageOutput:
    """Problems the given policy does not solve k/k: the training set of the last stage. Its
    rollouts stream to Parquet parts as they finish (rstar.rollout.runner.rollout_parts), so
    the driver holds only those running, and a retry resumes after the last part written."""
    from rstar.data.io import read_table, write_json, write_table
    from rstar.data.mine import candidates, mine_hard
    from rstar.reward.score import BatchScorer
    from rstar.rollout.open import open_agent_loop
    from rstar.rollout.runner import read_parts, rollout_parts
    from rstar.storage import atomic_write_text

    spec = recipe.mine
    rows = candidates(
        read_table(inputs.problems.uri, "problems").to_pylist(), spec.problems, spec.seed
    )
    # parts on storage belong to this policy and these problems only if this run's working
    # directory (keyed by both) says it started them; otherwise they are another run's
    _, work = cache.work_dir(recipe, "mine", inputs)
    parts = layout.trajectories("mine")
    fs, started = filesystem(f"{work}/started")
    if not fs.exists(started):
        remove_tree(parts)
        atomic_write_text(f"{work}/started", parts)
    clock = _rollout_clock("mine", len(rows) * spec.k)

    async def main() -> int:
        async with open_agent_loop(
            dirs.pull(inputs.model.uri),
            spec.sampling,
            prompt_style=recipe.prompt_style,
            **serving(recipe),
        ) as loop:
            with BatchScorer() as scorer:
                return await rollout_parts(
                    loop,
                    rows,
                    spec.k,
                    parts,
                    scorer=scorer,
                    in_flight=spec.in_flight,
                    stage="mine",
                    progress=clock.advance,
                )

    sampled = asyncio.run(main())
    log.tag("rstar.started_as", "fresh" if sampled == len(rows) else "resumed")
    hard, report = mine_hard(rows, read_parts(parts, ["problem_id", "reward"]), k=spec.k)
    path = write_table(hard, layout.dataset("hard_problems"), "hard_problems")
    write_json(report.to_dict(), layout.reports("mining.json"))
    made = Stored(path, digest(path))
    log.output(path, "hard_problems", made.digest)
    log.output(parts, "mine_trajectories", digest(parts))
    log.metrics(0, report.to_dict())
    return StageOutput(
        "mine", report.to_dict(), datasets={"hard_problems": made}, trajectories=parts
    )


def evaluate(recipe: Recipe, layout: Layout, inputs: StageInputs, log) -> StageOutput:
    """Every model in `inputs.models` on the held-out problems, side by side."""
    from rstar.data.io import read_table, write_json, write_table
    from rstar.eval.groups import group_table
    from rstar.eval.metrics import overall_accuracy, question_accuracy
    from rstar.eval.report import write_report
    from rstar.eval.run import evaluate_model, markdown_table, summarize_eval
    from rstar.machine import give_back_memory
    from rstar.pipeline.verdict import verdict

    problems_ = read_table(inputs.problems.uri, "problems").to_pylist()
    out_dir = layout.reports(inputs.report_name)
    # what lineage shows of this evaluation: its label and held-out set (its settings are the run's
    # params)
    log.tag(EVAL_LABEL, inputs.report_name)
    log.dataset(
        inputs.problems.uri,
        "eval_problems",
        inputs.problems.digest or digest(inputs.problems.uri),
        context="evaluation",
    )
    # each checkpoint's samples, kept in the stage's working directory (named by the recipe and
    # the inputs) as it finishes: a retried or resumed evaluation does not evaluate it again
    _, work = cache.work_dir(recipe, "evaluate", inputs)
    by_id = {p["id"]: p for p in problems_}
    summaries, questions, halves = {}, {}, ({}, {})
    for name, model in inputs.models.items():
        done = f"{work}/{name}.samples.parquet"
        fs, inner = filesystem(done)
        if fs.exists(inner):
            records = read_table(done, "trajectories").to_pylist()
            summaries[name] = summarize_eval(
                [{**r, "correct": r["reward"] > 0} for r in records], by_id, recipe.eval.k
            )
            log.tag(f"rstar.reused.{name}", done)
        else:
            path = dirs.pull(model.uri)
            # e.g. a registered version's files, changed
            if model.digest and (found := digest(path)) != model.digest:
                raise NotRetryable(
                    f"{name}: the files at {model.uri} have digest {found}, not the "
                    f"{model.digest} they were registered with"
                )
            clock = _rollout_clock(f"eval/{name}", len(problems_) * recipe.eval.k)
            records, summaries[name] = evaluate_model(
                path,
                problems_,
                recipe.eval,
                prompt_style=recipe.prompt_style,
                name=name,
                progress=clock.advance,
                **serving(recipe),
            )
            write_table(records, done, "trajectories")
            give_back_memory()  # the checkpoint's model and engine, before the next one loads
        write_table(records, f"{out_dir}/{name}.samples.parquet", "trajectories")
        questions[name] = question_accuracy(records)
        for half, acc in enumerate(halves):
            acc[name] = question_accuracy(records, half)
    for name in summaries:  # every sample, browsable from the evaluation's MLflow run
        log.artifact(f"{out_dir}/{name}.samples.parquet", "samples")
    write_json(summaries, f"{out_dir}/summary.json")
    # The recipe's verdict when these are its checkpoints (SFT, then RL stages), not a
    # re-evaluation's pick
    recipe_order = ["sft"] + [r.name for r in recipe.rl]
    trained = {name: s for name, s in summaries.items() if name != "base"}
    learnt, lines = (
        verdict(
            trained,
            recipe.expect,
            inputs.copying,
            questions,
            problems_,
            halves if recipe.eval.k >= 2 else None,
        )
        if list(trained) == recipe_order
        else (None, [])
    )
    if lines and "base" in summaries:
        before, after = overall_accuracy(summaries["base"]), overall_accuracy(summaries["sft"])
        lines.insert(0, f"sft held-out {before:.3f} -> {after:.3f} ({after - before:+.3f})")
    by_group = group_table(questions, problems_)
    for p in write_report(summaries, recipe.eval.k, out_dir, by_group):
        log.artifact(p)
    flat = {
        f"{name}/{bench}/{key}": value
        for name, s in summaries.items()
        for bench, m in s.items()
        for key, value in m.items()
        if isinstance(value, (int, float))
    }
    log.metrics(0, flat, prefix="eval/")
    if learnt is not None:
        log.tag("rstar.learnt", str(learnt).lower())
    return StageOutput(
        "evaluate",
        {k: v for k, v in flat.items() if k.endswith("avg_pass@1")},
        report=out_dir,
        evaluation=Evaluation(
            summaries,
            markdown_table(summaries, recipe.eval.k, by_group),
            learnt,
            lines,
        ),
    )


# each kind's body (rstar.pipeline.stage_table.KINDS); the RL stages share one, told which
BODIES = {
    "base": base,
    "problems": problems,
    "sft": sft,
    "rl": rl,
    "mine": mine,
    "evaluate": evaluate,
}


def run(stage: str, recipe: Recipe, inputs: StageInputs, log) -> StageOutput:
    """Run one stage by name (RL stages by their recipe names) and mark its outputs done."""
    kind = find(recipe, stage).kind
    named = {"stage": stage} if kind == "rl" else {}
    out = BODIES[kind](recipe, Layout(recipe.storage_root), inputs, log, **named)
    cache.mark_done(recipe, stage, inputs)
    return out
