"""Problems that installed Python packages ship, read offline, named by a URI in a problem set's
`files` list and curated like any file:

    champ://                                     CHAMP's 270 competition problems (champ-dataset)
    reasoning-gym://gsm_symbolic?n=500&seed=0    n problems of a reasoning-gym generator; any
                                                 other query key is a field of its config
    reasoning-gym://gsm_symbolic?n=100&templates=70-99
                                                 GSM-Symbolic from these of its 100 templates
                                                 only: hold out whole templates, since problems
                                                 of one template share most of their 8-grams

Rows come out as `(row_id, {"id", "problem", "answer", ...metadata})`; answers as the package
publishes them (CHAMP's are often expressions: curation's integer filter says which go).
"""

from __future__ import annotations

import difflib
import importlib.metadata
import importlib.util
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlsplit

import yaml

from rstar.data.io import DataError

CHAMP, GYM = "champ://", "reasoning-gym://"


def is_packaged(source: str) -> bool:
    return source.startswith((CHAMP, GYM))


def _require(module: str, dist: str, source: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise DataError(
            f"{source}: needs the package {dist} (scripts/setup.sh installs it: run `make setup`)"
        )


# reasoning-gym appends this to every GSM-Symbolic question. It is dropped: the prompt states
# the answer format, and ten shared words would make every training problem "contaminated"
# by the 8-gram rule.
GSM_SUFFIX = " Give the result as your final answer. Do not include units."


@dataclass(frozen=True)
class GymRequest:
    name: str
    n: int
    seed: int
    config: dict
    templates: frozenset[int] | None  # GSM-Symbolic's template ids to draw from (None: all)


def _templates(text, source: str) -> frozenset[int]:
    """'0-69' or '3,5,70-99' as a set of template ids."""
    ids: set[int] = set()
    try:
        for part in str(text).split(","):
            lo, _, hi = part.partition("-")
            ids.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise DataError(f"{source}: templates is a list of ids and ranges, e.g. 0-69") from None
    return frozenset(ids)


def _gym_request(source: str) -> GymRequest:
    """What a reasoning-gym URI asks for, or a DataError saying what is wrong with it."""
    url = urlsplit(source)
    name = url.netloc + url.path
    params = {k: yaml.safe_load(v) for k, v in parse_qsl(url.query, keep_blank_values=True)}
    try:
        n, seed = int(params.pop("n")), int(params.pop("seed", 0))
    except KeyError:
        raise DataError(f"{source}: say how many problems, e.g. '{GYM}{name}?n=500'") from None
    except (TypeError, ValueError):
        raise DataError(f"{source}: n and seed must be integers") from None
    if n <= 0:
        raise DataError(f"{source}: n must be positive (got {n})")
    templates = params.pop("templates", None)
    if templates is not None and name != "gsm_symbolic":
        raise DataError(f"{source}: templates is an option of gsm_symbolic only")
    return GymRequest(
        name, n, seed, params, None if templates is None else _templates(templates, source)
    )


def _gym_dataset(source: str, req: GymRequest, size: int):
    _require("reasoning_gym", "reasoning-gym", source)
    with warnings.catch_warnings():  # cellpylib, which it imports, compares with `is` a literal
        warnings.simplefilter("ignore", SyntaxWarning)
        import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if req.name not in DATASETS:
        close = difflib.get_close_matches(req.name, list(DATASETS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise DataError(f"{source}: reasoning-gym has no dataset {req.name!r}{hint}")
    try:
        return reasoning_gym.create_dataset(req.name, size=size, seed=req.seed, **req.config)
    except (TypeError, ValueError, AssertionError) as e:  # its config's own checks: pass them on
        raise DataError(f"{source}: reasoning-gym refused the config {req.config} ({e})") from None


def _gym_items(source: str, req: GymRequest) -> Iterator[tuple[int, dict, int | None]]:
    """(index, item, GSM-Symbolic template or None) of the n problems asked for."""
    if req.templates is None:
        ds = _gym_dataset(source, req, req.n)
        picked = range(req.n)
    else:
        from reasoning_gym.arithmetic.gsm_symbolic.gsm_symbolic import tasks_ok

        usable = req.templates & set(tasks_ok)
        if not usable:
            raise DataError(f"{source}: none of these templates is one reasoning-gym generates")
        # each index draws its template uniformly, a prefix-stable draw: enough indices for n
        ds = _gym_dataset(source, req, req.n * len(tasks_ok) // len(usable) * 2 + 100)
        picked = [i for i, t in enumerate(ds.task_indices) if t in usable][: req.n]
        if len(picked) < req.n:
            raise DataError(f"{source}: {len(picked)} problems of these templates, not {req.n}")
    templates = getattr(ds, "task_indices", None)
    for i in picked:
        yield i, ds[i], None if templates is None else templates[i]


def check(source: str) -> None:
    """Fail fast (a DataError naming the URI and what is wrong) on a source that cannot load:
    the package missing, an unknown dataset, a config field the generator refuses."""
    if source.startswith(CHAMP):
        _require("champ_dataset", "champ-dataset", source)
        if source != CHAMP:
            raise DataError(f"{source}: CHAMP takes no path or options; write '{CHAMP}'")
    else:
        next(_gym_items(source, _gym_request(source)))  # builds the generator, draws one problem


def packaged_rows(source: str) -> Iterator[tuple[int, dict]]:
    if source.startswith(CHAMP):
        check(source)
        yield from _champ_rows()
        return
    req = _gym_request(source)
    # _gym_items raises what check() would, before the first row
    for i, item, template in _gym_items(source, req):
        question = item["question"]
        yield (
            i,
            {
                "id": f"reasoning-gym/{req.name}/{req.seed}/{i}",
                "problem": question.removesuffix(GSM_SUFFIX),
                "answer": item["answer"],
                "benchmark": req.name,  # what evaluation reports it under
                "template": template,
                "generated": item.get("metadata", {}),
            },
        )


def _champ_rows() -> Iterator[tuple[int, dict]]:
    # read the package's JSON as data (its module imports natsort and more just to parse it)
    dist = importlib.metadata.distribution("champ-dataset")
    path = next(f for f in dist.files or () if str(f).endswith("dataset_files/v0.json"))
    with open(dist.locate_file(path), encoding="utf-8") as f:
        problems = json.load(f)["problems"]
    for i, (key, p) in enumerate(problems.items()):
        yield (
            i,
            {
                "id": f"champ/{key}",
                "problem": p["_text"],
                "answer": p["_answer"],
                "benchmark": "champ",
                "category": p["category"],
            },
        )
