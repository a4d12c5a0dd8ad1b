"""Curation of the RL problem set (the paper's 42K): normalise, filter, report.

Filters, in order, each counted in the report: unreadable or malformed rows; non-integer
answers; answers too large to verify; normalised-text duplicates; decontamination (an 8-gram
shared with an evaluation problem, or the same normalised text for problems shorter than 8
words); and, optionally, consistency (a model samples k answers,
a problem stays if at least m verify against its label). Every dropped row goes to the
rejects file with its source, row id and reason.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from rstar.data.io import DataError, write_json, write_table
from rstar.data.sources import PRESETS, BadRow, Columns, column_error, get_field, read_rows
from rstar.reward.verify import normalize_integer, verify

REASONS = (
    "bad_json",
    "wrong_type",
    "missing_problem",
    "missing_answer",
    "too_long",
    "non_integer_answer",
    "answer_too_large",
    "duplicate",
    "contaminated",
    "inconsistent",
)

# Given problems, return k sampled final answers for each (the rollout engine provides one).
AnswerSampler = Callable[[list[dict]], list[list[str | None]]]


@dataclass
class SourceSpec:
    path: str  # a .parquet/.jsonl file or a Hugging Face dataset name
    name: str | None = None  # the `source` column; defaults to the path
    columns: Columns = field(default_factory=Columns)
    split: str = "train"

    @classmethod
    def parse(cls, text: str) -> SourceSpec:
        """'path', 'path:preset' (presets: generic, dapo, openmathreasoning, project_euler, aops)
        or 'path:problem=<column>,answer=<column>[,id=<column>]' (dotted paths reach nested
        fields)."""
        path, sep, preset = text.rpartition(":")
        if not sep or "/" in preset:  # no preset given ("s3://b/k.parquet" has a ':' of its own)
            return cls(path=text)
        if "=" in preset:
            mapping = dict(part.partition("=")[::2] for part in preset.split(","))
            unknown = set(mapping) - {"problem", "answer", "id"}
            if unknown or not all(mapping.values()):
                raise DataError(
                    f"{text}: a column mapping names problem=, answer= and optionally id= (got "
                    f"{preset!r})"
                )
            return cls(path=path, columns=Columns(**{"id": None, **mapping}))
        if preset not in PRESETS:
            raise DataError(f"{text}: unknown column preset {preset!r}; known: {sorted(PRESETS)}")
        return cls(path=path, columns=PRESETS[preset])


@dataclass
class CurationConfig:
    integer_only: bool = True
    max_answer_digits: int = 30  # longer answers are "too large to verify" (Project Euler's giants)
    max_problem_chars: int = (
        8000  # longer problem texts are rejected as too_long (scraped pages, not problems)
    )
    dedup: bool = True
    ngram: int = 8  # decontamination n-gram size, in words
    consistency_min: int = 2  # sampled answers that must match the label (k is the sampler's)


@dataclass
class CurationReport:
    read: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    # source -> {"read": n, "kept": n, <reason>: n dropped for it}
    by_source: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def format(self) -> str:
        lines = [f"read {self.read}, kept {self.kept}"]
        lines += [f"  dropped {n:>7} {reason}" for reason, n in self.dropped.items() if n]
        for source, counts in self.by_source.items():
            why = ", ".join(f"{r} {n}" for r, n in counts.items() if r not in ("read", "kept"))
            lines.append(
                f"  {source}: read {counts['read']}, kept {counts['kept']}"
                + (f" (dropped: {why})" if why else "")
            )
        return "\n".join(lines)


def normalize_text(text: str) -> str:
    """Case, accents, punctuation, LaTeX spacing and whitespace folded away (for de-duplication)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = re.sub(r"\\[,;:! ]|\\quad|\\qquad|\$", " ", text)
    text = re.sub(r"[^\w\s]", " ", text)
    return " ".join(text.split())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = normalize_text(text).split()
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _raw(row) -> str:
    try:
        return json.dumps(row, default=str)[:2000]
    except (TypeError, ValueError):
        return str(row)[:2000]


def _normalise_row(row_id: int, row: dict, spec: SourceSpec) -> dict | tuple[str, str]:
    """A schema row, or (reason, detail) when the row is malformed."""
    cols = spec.columns
    problem, answer = get_field(row, cols.problem), get_field(row, cols.answer)
    if problem is None or (isinstance(problem, str) and not problem.strip()):
        return "missing_problem", f"column {cols.problem!r} is missing or empty"
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        return "missing_answer", f"column {cols.answer!r} is missing or empty"
    if not isinstance(problem, str):
        return "wrong_type", f"column {cols.problem!r} is {type(problem).__name__}, not a string"
    if isinstance(answer, bool) or not isinstance(answer, (str, int)):
        return (
            "wrong_type",
            f"column {cols.answer!r} is {type(answer).__name__}, not a string or integer",
        )
    rid = get_field(row, cols.id) if cols.id else None
    source = spec.name or spec.path
    used = {cols.problem.split(".")[0], cols.answer.split(".")[0], (cols.id or "").split(".")[0]}
    metadata = {k: v for k, v in row.items() if k not in used}
    return {
        "id": str(rid) if rid is not None else f"{source}#{row_id}",
        "problem": problem.strip(),
        "answer": str(answer).strip(),
        "source": source,
        "metadata": json.dumps(metadata, default=str),
    }


def curate(
    sources: Iterable[SourceSpec],
    out_path: str,
    rejects_path: str,
    *,
    eval_problems: Iterable[str] = (),
    cfg: CurationConfig | None = None,
    sampler: AnswerSampler | None = None,
    progress: Callable[[int], None] | None = None,
) -> CurationReport:
    """Curate `sources` into `out_path` (problems schema); rejects and a report beside it."""
    cfg = cfg or CurationConfig()
    report = CurationReport()
    eval_problems = list(eval_problems)
    eval_grams: set = (
        set().union(*(ngrams(p, cfg.ngram) for p in eval_problems)) if eval_problems else set()
    )
    # catches problems too short for an n-gram
    eval_texts = {normalize_text(p) for p in eval_problems}
    kept: list[dict] = []
    rejects: list[dict] = []
    seen: set[str] = set()

    def counts(spec: SourceSpec) -> Counter:
        return report.by_source.setdefault(spec.name or spec.path, Counter(read=0, kept=0))

    def reject(spec: SourceSpec, row_id: int, reason: str, detail: str, raw: str) -> None:
        report.dropped[reason] += 1
        counts(spec)[reason] += 1
        rejects.append(
            {
                "row_id": row_id,
                "source": spec.name or spec.path,
                "reason": reason,
                "detail": detail,
                "raw": raw,
            }
        )

    for spec in sources:
        counts(spec)  # listed even when it yields nothing
        columns: set[str] = set()  # every top-level column the file's rows have
        mapped = False  # some row has the problem and answer columns
        for row_id, row in read_rows(spec.path, split=spec.split):
            report.read += 1
            counts(spec)["read"] += 1
            if progress:
                progress(1)
            if isinstance(row, BadRow):
                reject(spec, row_id, row.reason, row.detail, row.raw)
                continue
            columns.update(row)
            mapped = mapped or column_error(spec.path, spec.columns, row) is None
            rec = _normalise_row(row_id, row, spec)
            if isinstance(rec, tuple):
                reject(spec, row_id, rec[0], rec[1], _raw(row))
                continue
            if len(rec["problem"]) > cfg.max_problem_chars:
                reject(
                    spec,
                    row_id,
                    "too_long",
                    f"problem text has {len(rec['problem'])} characters (limit "
                    f"{cfg.max_problem_chars})",
                    _raw(row)[:2000],
                )
                continue
            integer = normalize_integer(rec["answer"])
            if cfg.integer_only and integer is None:
                reject(
                    spec,
                    row_id,
                    "non_integer_answer",
                    f"answer {rec['answer'][:100]!r} is not an integer",
                    _raw(row),
                )
                continue
            if integer is not None:
                if len(integer.lstrip("-")) > cfg.max_answer_digits:
                    reject(
                        spec,
                        row_id,
                        "answer_too_large",
                        f"answer has {len(integer.lstrip('-'))} digits (limit "
                        f"{cfg.max_answer_digits})",
                        _raw(row),
                    )
                    continue
                rec["answer"] = integer
            key = normalize_text(rec["problem"])
            if cfg.dedup and key in seen:
                reject(
                    spec,
                    row_id,
                    "duplicate",
                    "same normalised text as an earlier problem",
                    _raw(row),
                )
                continue
            seen.add(key)
            if key in eval_texts:
                reject(
                    spec, row_id, "contaminated", "identical to an evaluation problem", _raw(row)
                )
                continue
            overlap = ngrams(rec["problem"], cfg.ngram) & eval_grams
            if overlap:
                reject(
                    spec,
                    row_id,
                    "contaminated",
                    f"shares the {cfg.ngram}-gram {' '.join(next(iter(overlap)))!r} with an "
                    "evaluation problem",
                    _raw(row),
                )
                continue
            rec["_spec"], rec["_row_id"] = spec, row_id
            kept.append(rec)
        if columns and not mapped:  # a layout problem, not thousands of bad rows
            raise DataError(column_error(spec.path, spec.columns, columns))

    if sampler is not None:
        kept = _consistency_filter(kept, sampler, cfg, reject)
    for rec in kept:
        counts(rec.pop("_spec"))["kept"] += 1
        del rec["_row_id"]
    report.kept = len(kept)
    report.by_source = {k: dict(v) for k, v in report.by_source.items()}
    write_table(kept, out_path, "problems")
    write_table(rejects, rejects_path, "rejects")
    return report


def _consistency_filter(
    kept: list[dict], sampler: AnswerSampler, cfg: CurationConfig, reject
) -> list[dict]:
    samples = sampler(kept)
    if len(samples) != len(kept):
        raise ValueError(
            f"the answer sampler returned {len(samples)} lists for {len(kept)} problems"
        )
    out = []
    for rec, answers in zip(kept, samples):
        matches = sum(verify(a, rec["answer"]) for a in answers if a is not None)
        if matches >= cfg.consistency_min:
            out.append(rec)
        else:
            reject(
                rec["_spec"],
                rec["_row_id"],
                "inconsistent",
                f"{matches} of {len(answers)} sampled answers match the label (need "
                f"{cfg.consistency_min})",
                _raw({k: v for k, v in rec.items() if not k.startswith("_")}),
            )
    return out


def write_report(report: CurationReport, path: str) -> str:
    return write_json(report.to_dict(), path)
