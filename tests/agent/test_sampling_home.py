"""How rollouts are sampled has one home (rstar.agent.sampling): the agent loop takes a recipe's
`Sampling` block as it is, and a block is written out only where settings come from outside a
recipe. A new place that builds one (or a wrapper that rebuilds it, as LoopConfig did in eight
places with five different defaults) fails here."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# where a Sampling block may be built, and why
ALLOWED = {
    "rstar/agent/sampling.py": "its defaults and the paper's evaluation protocol",
    "rstar/agent/verl_adapter.py": "the recipe's block, back from the Hydra config verl hands on",
    "rstar/cli/rollout.py": "a one-off command's flags (no recipe)",
    "rstar/cli/data.py": "a one-off command's flags (no recipe)",
}


def sampling_built(root: Path) -> dict[str, list[int]]:
    """File -> lines where `Sampling(...)` is called, over rstar/, tasks/ and flows/."""
    found: dict[str, list[int]] = {}
    for top in ("rstar", "tasks", "flows"):
        for path in sorted((root / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name == "Sampling":
                    found.setdefault(str(path.relative_to(root)), []).append(node.lineno)
    return found


def test_sampling_blocks_are_built_only_where_settings_enter():
    extra = {f: lines for f, lines in sampling_built(ROOT).items() if f not in ALLOWED}
    assert not extra, f"Sampling built outside its homes (take the recipe's block): {extra}"


def test_the_check_finds_a_new_construction_site(tmp_path):
    (tmp_path / "rstar" / "eval").mkdir(parents=True)
    (tmp_path / "rstar" / "eval" / "run.py").write_text(
        "from rstar.agent import sampling\ndef f():\n    return sampling.Sampling(max_turns=3)\n"
    )
    assert sampling_built(tmp_path) == {"rstar/eval/run.py": [3]}
