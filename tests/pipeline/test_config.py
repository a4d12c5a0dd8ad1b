"""Recipe validation: one clear error naming the file and the key or path, before any stage."""

from pathlib import Path

import pytest

from rstar.pipeline import cache
from rstar.pipeline.config import ConfigError, load_recipe
from rstar.pipeline.records import ModelRef, StageInputs

TINY = "configs/tiny.yaml"


def test_tiny_recipe_loads_with_the_trainers_dataclasses():
    recipe = load_recipe(TINY)
    assert [s.name for s in recipe.rl] == ["rl1", "rl2", "rl3"]
    # the paper's 8K/12K/12K, scaled
    assert [s.sampling.max_response_tokens for s in recipe.rl] == [100, 256, 256]
    assert recipe.rl[2].reset_optimizer and not recipe.rl[0].reset_optimizer
    assert recipe.mine.after == "rl2"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"rl.1.max_turnz": 3}, r"tiny.yaml: rl\.1\.max_turnz: unknown key"),
        ({"sft.train.epochs": "many"}, r"sft\.train\.epochs: Input should be a valid integer"),
        ({"rl.0.roc.group_sise": 2}, r"rl\.0\.roc\.group_sise: unknown key"),
        ({"storage_roots": "x"}, r"storage_roots: unknown key"),
        (
            {"train_problems": {"files": ["/no/such/problems.parquet"]}},
            r"train_problems\.files\.0: /no/such/problems\.parquet does not exist",
        ),
        (
            {"train_problems": {"files": ["/no/such/dapo.parquet:dapo"]}},
            r"/no/such/dapo\.parquet does not exist",
        ),
        ({"mine.after": "rl3"}, r"mine\.after must name an RL stage before the last"),
        (
            {"rl.1.mini_batches": 3},
            r"rl stage rl2: mini_batches \(3\) must divide prompts_per_step \(8\)",
        ),
        (
            {"train_problems.synthetic.families": ["nope"], "train_problems.synthetic.levels": [1]},
            r"unknown families \['nope'\]",
        ),
        (
            {
                "eval_problems.synthetic.families": ["big_product", "power_mod"],
                "eval_problems.synthetic.levels": {"power_mod": [1]},
            },
            r"eval_problems\.synthetic: .*no levels given for families \['big_product'\]",
        ),
        ({"prompt_style": "fancy"}, r"prompt_style: Input should be 'paper' or 'compact'"),
        (
            {"rl.3.steps": 3},
            r"rl\.3\.steps: rl has 3 entries, numbered from 0 \(or by name: rl1, rl2, rl3\)",
        ),
        ({"rl.two.steps": 3}, r"rl\.two\.steps: rl has 3 entries"),
        ({"rl4.steps": 3}, r"rl4: unknown key"),
        ({"sft.examples.n": 3}, r"sft\.examples\.n: sft\.examples is a value"),
    ],
)
def test_bad_recipes_name_what_is_wrong(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_recipe(TINY, overrides)


def test_an_rl_stage_is_set_by_its_name_or_its_position():
    by_name = load_recipe(TINY, {"rl2.steps": 20, "rl3.roc.group_size": 2})
    by_position = load_recipe(TINY, {"rl.1.steps": 20, "rl.2.roc.group_size": 2})
    assert by_name == by_position
    plain = load_recipe(TINY)
    assert [s.steps for s in by_name.rl] == [plain.rl[0].steps, 20, plain.rl[2].steps]
    assert by_name.rl[2].roc.group_size == 2


def test_missing_or_broken_recipe_file(tmp_path):
    with pytest.raises(ConfigError, match="no such recipe file"):
        load_recipe(str(tmp_path / "absent.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_recipe(str(bad))


def test_cache_keys_change_only_for_the_stages_a_change_touches():
    base = load_recipe(TINY)
    changed = load_recipe(TINY, {"eval.k": 2, "rl.2.steps": 3})
    inputs = StageInputs(model=ModelRef("m", "abc"))
    for stage in ("base", "problems", "sft", "rl1", "rl2", "mine"):
        assert cache.key(base, stage, inputs) == cache.key(changed, stage, inputs)
    for stage in ("rl3", "evaluate"):
        assert cache.key(base, stage, inputs) != cache.key(changed, stage, inputs)
    assert cache.key(base, "sft", inputs) != cache.key(
        base, "sft", StageInputs(model=ModelRef("m", "def"))
    )


def test_the_last_rl_stages_key_follows_the_mined_problems():
    """rl3 trains on what mining found: another mined set (its digest) is another rl3, even from
    the same model and recipe, or a stale rl3 would be served after mining changed."""
    from rstar.pipeline.records import StageOutput, Stored
    from rstar.pipeline.stage_table import recipe_stages

    recipe = load_recipe(TINY)
    stages = {s.name: s for s in recipe_stages(recipe)}
    last = recipe.rl[-1].name

    def key(mined_digest: str) -> str:
        outs = {
            name: StageOutput(
                name,
                model=ModelRef(f"{name}-model", "same"),
                datasets={
                    "train": Stored("train", "same"),
                    "hard_problems": Stored("hard", mined_digest),
                },
            )
            for name in stages
        }
        return cache.key(recipe, last, stages[last].inputs(outs))

    assert key("mined-1") != key("mined-2")


def test_a_new_code_version_changes_every_cache_key(monkeypatch):
    import rstar

    recipe = load_recipe(TINY)
    before = {
        stage: cache.key(recipe, stage, StageInputs())
        for stage in ("base", "sft", "rl1", "evaluate")
    }
    monkeypatch.setattr(rstar, "__version__", rstar.__version__ + ".post1")
    assert all(cache.key(recipe, stage, StageInputs()) != old for stage, old in before.items())


def test_the_paper_recipe_validates_and_its_inputs_are_checked(s3):
    recipe = load_recipe("configs/qwen3-14b.yaml", check_inputs=False)
    assert recipe.engine == "verl" and recipe.base.path == "Qwen/Qwen3-14B-Base"
    assert [(s.sampling.max_response_tokens, s.steps, s.sampling.max_turns) for s in recipe.rl] == [
        (8192, 300, 10),
        (12288, 85, 10),
        (12288, 125, 15),
    ]
    assert [s.roc.group_size * s.roc.oversample for s in recipe.rl] == [32, 32, 32]
    assert recipe.rl[2].reset_optimizer and recipe.mine.k == 8
    with pytest.raises(
        ConfigError,
        match=r"sft\.files\.0: s3://rstar/raw/sft_function_calling\.jsonl does not exist",
    ):
        load_recipe("configs/qwen3-14b.yaml", {"train_problems": {"synthetic": {"n": 5}}})
    with pytest.raises(ConfigError, match="engine 'verl' on GPUs needs sandbox_url"):
        load_recipe("configs/qwen3-14b.yaml", {"sandbox_url": None}, check_inputs=False)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_rl_stage_never_resumes_another_recipes_checkpoint(where, tmp_path, request):
    """Each recipe + inputs gets its own working directory: a retry finds its checkpoint, a
    run of a changed recipe at the same root starts clean (and the stale directory goes, from
    remote storage too)."""
    from rstar.pipeline.cache import work_dir
    from rstar.storage import filesystem

    root = str(tmp_path) if where == "local" else request.getfixturevalue("s3") + "/workdirs"
    inputs = StageInputs(model=ModelRef("m", "abc"))
    first = load_recipe("configs/tiny.yaml", {"storage_root": root})
    changed = load_recipe("configs/tiny.yaml", {"storage_root": root, "rl.0.lr": 1e-4})
    work, remote = work_dir(first, "rl1", inputs)
    fs, path = filesystem(f"{remote}/checkpoint/trainer_state.pt")
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, b"state")
    assert work_dir(first, "rl1", inputs) == (work, remote)  # the retry resumes here
    assert fs.exists(path)
    other = work_dir(changed, "rl1", inputs)[1]
    assert other != remote and not fs.exists(path)
    assert work_dir(first, "rl1", StageInputs(model=ModelRef("m", "def")))[1] != remote


def test_a_truncated_input_file_fails_the_recipe_check_naming_it(tmp_path):
    """It used to pass (only existence was checked); the problems stage then failed three times."""
    from rstar.data import synth
    from rstar.data.io import write_table

    good = write_table(synth.generate(4, seed=1), str(tmp_path / "good.parquet"), "problems")
    data = Path(good).read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(
        ConfigError, match=r"train_problems\.files\.0: .*cut\.parquet is not readable"
    ):
        load_recipe(
            "configs/tiny.yaml", {"train_problems": {"files": [str(tmp_path / "cut.parquet")]}}
        )
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match=r"bad\.jsonl is not readable \(JSONDecodeError"):
        load_recipe(
            "configs/tiny.yaml", {"train_problems": {"files": [str(tmp_path / "bad.jsonl")]}}
        )


def test_a_problem_file_whose_columns_do_not_map_fails_the_recipe_check(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_pylist([{"question": "1+1?", "solution": "2"}]), tmp_path / "qs.parquet"
    )
    path = str(tmp_path / "qs.parquet")
    with pytest.raises(
        ConfigError,
        match=r"train_problems\.files\.0: .*qs\.parquet: no column 'problem' or 'answer' "
        r"for the problem and answer \(its columns: question, solution\)",
    ):
        load_recipe("configs/tiny.yaml", {"train_problems": {"files": [path]}})
    (tmp_path / "qs.jsonl").write_text('{"problem": "1+1?", "solution": "2"}\n')
    with pytest.raises(ConfigError, match=r"no column 'answer' for the answer"):
        load_recipe(
            "configs/tiny.yaml", {"train_problems": {"files": [str(tmp_path / "qs.jsonl")]}}
        )
    mapped = load_recipe(
        "configs/tiny.yaml",
        {"train_problems": {"files": [f"{path}:problem=question,answer=solution"]}},
    )
    assert mapped.train_problems.files == [f"{path}:problem=question,answer=solution"]


def test_an_unknown_key_suggests_the_key_it_resembles():
    with pytest.raises(ConfigError, match=r"rl\.2\.stepz: unknown key \(did you mean 'steps'\?\)"):
        load_recipe("configs/tiny.yaml", {"rl.2.stepz": 3})
    with pytest.raises(
        ConfigError, match=r"sft\.train\.epocs: unknown key \(did you mean 'epochs'\?\)"
    ):
        load_recipe("configs/tiny.yaml", {"sft.train.epocs": 3})
    with pytest.raises(ConfigError, match=r"zzz: unknown key$"):
        load_recipe("configs/tiny.yaml", {"zzz": 1})


def test_a_sampling_setting_outside_its_block_says_where_it_belongs():
    """Each use (an RL stage, mining, evaluation) has one sampling block; a setting beside it
    (where recipes before 0.18 had them) names the key it belongs under."""
    for key, where in [
        ("rl.0.max_turns", r"rl\.0\.sampling\.max_turns"),
        ("mine.temperature", r"mine\.sampling\.temperature"),
        ("eval.max_response_tokens", r"eval\.sampling\.max_response_tokens"),
    ]:
        with pytest.raises(
            ConfigError, match=rf"unknown key \(it belongs under sampling: {where}\)"
        ):
            load_recipe("configs/tiny.yaml", {key: 3})
    recipe = load_recipe("configs/tiny.yaml", {"mine.sampling.top_p": 0.9})
    assert recipe.mine.sampling.top_p == 0.9 and recipe.mine.sampling.max_turns == 4


def test_switching_the_engine_changes_the_cache_key_of_every_stage_it_runs():
    local = load_recipe("configs/tiny-verl.yaml", {"engine": "local"})
    verl = load_recipe("configs/tiny-verl.yaml")
    inputs = StageInputs(model=ModelRef("m", "d"))
    for stage in ("base", "problems"):  # made the same way by either
        assert cache.key(local, stage, inputs) == cache.key(verl, stage, inputs)
    for stage in ("sft", "rl1", "mine", "evaluate"):  # verl's SFT trainer is not the local one
        assert cache.key(local, stage, inputs) != cache.key(verl, stage, inputs)
