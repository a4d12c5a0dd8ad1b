"""The image is built from the working tree (`COPY . .` in infra/Dockerfile): whatever git
ignores (a virtualenv, runs, MLflow stores, caches) must stay out of it too."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def docker_form(pattern: str) -> str:
    """A .gitignore pattern as .dockerignore writes it: relative to the context's root, where a
    git pattern without a slash inside matches at any depth."""
    anchored = pattern.startswith("/") or "/" in pattern.strip("/")
    bare = pattern.strip("/")
    return bare if anchored else f"**/{bare}"


def lines(name: str) -> list[str]:
    text = (ROOT / name).read_text().splitlines()
    return [line.strip() for line in text if line.strip() and not line.startswith("#")]


def test_the_image_leaves_out_what_git_ignores_and_the_history():
    docker = set(lines(".dockerignore"))
    missing = [
        p
        for p in lines(".gitignore")
        if docker_form(p) not in docker and p.strip("/") not in docker
    ]
    assert not missing, f".dockerignore lacks what .gitignore ignores: {missing}"
    assert ".git" in docker
