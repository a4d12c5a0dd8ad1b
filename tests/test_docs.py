"""The docs name what exists: every link and repository path resolves inside the repository,
every `rstar.*` name is defined where it says, every `rstar ...` command and its options and
every `make` target exist, the architecture table's names are in its files, the README's
figures are the benchmarks page's, and the docs' Python examples run."""

import ast
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        ROOT / "CHANGELOG.md",
        ROOT / "infra" / "OPERATIONS.md",
        *(ROOT / "docs").glob("*.md"),
    ]
)
# `models/base` is a path under a storage root; the repository's models/ holds the tiny base
TOP = (
    "rstar/",
    "flows/",
    "tasks/",
    "configs/",
    "docs/",
    "infra/",
    "scripts/",
    "tests/",
    "models/tiny",
    ".ci/",
)
FILES = (
    "Makefile",
    "pyproject.toml",
    "constraints.txt",
    "README.md",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
)


def spans(text: str) -> list[str]:
    """Inline code spans, outside fenced blocks."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", prose)


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.M)}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_repository(doc):
    text = doc.read_text()
    assert "../shared" not in text and "REFERENCE.md" not in text
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        path = (doc.parent / file).resolve() if file else doc
        outside = not path.is_relative_to(ROOT) or not path.exists()
        if outside or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            bad.append(target)
    assert bad == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_paths_exist(doc):
    missing = []
    for span in spans(doc.read_text()):
        for word in span.split():
            word = word.rstrip(".,:;)").split(":")[0]
            named = (word.startswith(TOP) or word in FILES) and not re.search(r"[<*{]", word)
            if named and not (ROOT / word.rstrip("/")).exists():
                missing.append(word)
    assert missing == []


def _module_path(dotted: str) -> Path | None:
    path = ROOT.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def python_name(dotted: str) -> bool:
    """Whether a dotted name in the docs means code (`rstar.pipeline.cache`), not an MLflow
    tag or metadata key that happens to start the same way (`rstar.attempts`)."""
    parts = dotted.split(".")
    return (ROOT / parts[0] / parts[1]).exists() or (ROOT / parts[0] / f"{parts[1]}.py").exists()


def _names(tree) -> set[str]:
    """Names a module or class body defines (functions, classes, assignments, imports)."""
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return out


def defined(file: Path, name: str) -> bool:
    """`name` ("f", "Class.attr") is defined in `file`."""
    tree = ast.parse(file.read_text())
    first, _, rest = name.partition(".")
    if first not in _names(tree):
        return False
    if not rest:
        return True
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == first), None)
    return cls is not None and rest.split(".")[0] in _names(cls)


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        path = _module_path(".".join(parts[:cut]))
        if path:
            rest = ".".join(parts[cut:])
            return not rest or defined(path, rest)
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_names_are_defined(doc):
    names = {
        m
        for span in spans(doc.read_text())
        for m in re.findall(r"\b((?:rstar|flows|tasks)(?:\.\w+)+)", span)
    }
    assert sorted(n for n in names if python_name(n) and not resolves(n)) == []


def test_the_architecture_tables_names_are_in_its_files():
    missing = []
    for line in (ROOT / "docs" / "architecture.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != 3 or ".py`" not in cells[1] or "`" not in cells[2]:
            continue  # not a row of the concept table
        files = [ROOT / f for f in re.findall(r"`([^`]+\.py)`", cells[1])]
        for name in re.findall(r"`([^`]+)`", cells[2]):
            name = re.match(r"[A-Za-z_][\w.]*", name).group(0)
            if not any(f.exists() and defined(f, name) for f in files):
                missing.append(f"{name} in {cells[1]}")
    assert missing == []


def _commands(text: str) -> list[list[str]]:
    lines = [line for block in blocks(text, "bash") for line in block.splitlines()]
    lines += spans(text)
    out = []
    for line in lines:
        line = line.split("  #")[0].strip()
        m = re.match(r"^(?:\S*=\S* )*(?:\.venv/bin/)?rstar (.*)$", line)
        if m and not line.endswith("\\"):
            out.append(shlex.split(m.group(1).replace("...", "")))
    return out


def _check(command, words: list[str]) -> str | None:
    """Why `rstar <words>` is not a command line of the app, or None."""
    while words:
        word = words.pop(0)
        if word.startswith("--"):
            flag = word.split("=")[0]
            param = next((p for p in command.params if flag in (*p.opts, *p.secondary_opts)), None)
            if param is None and flag != "--help":
                return f"{command.name}: no option {flag}"
            if (
                param is not None
                and not getattr(param, "is_flag", False)
                and "=" not in word
                and words
            ):
                words.pop(0)  # its value
        elif hasattr(command, "commands"):  # a group: the word names a command of it
            if word not in command.commands:
                return f"{command.name}: no command {word}"
            command = command.commands[word]
    return None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_exist(doc):
    import typer

    from flows.cli import app

    root = typer.main.get_command(app)
    text = doc.read_text()
    wrong = [
        " ".join(words) + f" ({why})"
        for words in _commands(text)
        if (why := _check(root, list(words)))
    ]
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    wrong += [
        f"make {t}"
        for t in re.findall(r"\bmake ([a-z][\w-]*)", text)
        if t not in targets and t not in ("sure",)
    ]
    assert wrong == []


def test_the_readmes_figures_are_the_benchmarks_pages():
    figures = re.findall(r"\b\d\.\d{3}\b", (ROOT / "README.md").read_text())
    benchmarks = (ROOT / "docs" / "benchmarks.md").read_text()
    assert figures and [f for f in figures if f not in benchmarks] == []


@pytest.mark.parametrize("doc", ["docs/data.md", "docs/sandbox.md"])
def test_the_python_examples_run(doc):
    for code in blocks((ROOT / doc).read_text(), "python"):
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
        )
        assert out.returncode == 0, out.stderr[-3000:]
