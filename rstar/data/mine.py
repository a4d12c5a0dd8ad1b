"""Hard-sample mining for RL stage 3: keep the problems the latest policy does not solve k/k.

Pure over trajectory records (anything with a problem id and a 0/1 reward), so the
pipeline can mine after any stage. A problem is dropped only when it has at least k
rollouts and all of them are correct; problems with fewer rollouts stay (not proven easy)
and are counted in the report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass


@dataclass
class MiningReport:
    problems: int
    kept: int
    dropped_solved: int
    undersampled: int
    k: int
    mean_pass_rate: float

    def to_dict(self) -> dict:
        return asdict(self)

    def format(self) -> str:
        return (
            f"{self.problems} problems -> {self.kept} hard (dropped {self.dropped_solved} solved "
            f"{self.k}/{self.k}; {self.undersampled} kept with fewer than {self.k} rollouts); mean "
            f"pass rate {self.mean_pass_rate:.3f}"
        )


def candidates(problems: list[dict], n: int | None, seed: int) -> list[dict]:
    """The `n` training problems to mine among (all for None): a seeded draw over the whole set,
    not its first rows, which are one source's (curation keeps its files' order; SmolLM2's
    recipe mined 32 word problems and no arithmetic)."""
    if n is None or n >= len(problems):
        return problems
    import random

    return random.Random(seed).sample(problems, n)


def mine_hard(
    problems: Iterable[dict],
    rollouts: Iterable[dict],
    *,
    k: int = 8,
    id_key: str = "problem_id",
    reward_key: str = "reward",
) -> tuple[list[dict], MiningReport]:
    """`problems`: rows of the problems schema; `rollouts`: records with `id_key` and `reward_key`.
    Returns rows of the hard_problems schema and a report."""
    n = defaultdict(int)
    correct = defaultdict(int)
    for r in rollouts:
        n[r[id_key]] += 1
        correct[r[id_key]] += int(r[reward_key] > 0)
    hard, total, solved, under, rates = [], 0, 0, 0, []
    for p in problems:
        total += 1
        seen, ok = n[p["id"]], correct[p["id"]]
        rate = ok / seen if seen else 0.0
        rates.append(rate)
        if seen >= k and ok == seen:
            solved += 1
            continue
        under += seen < k
        hard.append({**p, "n_samples": seen, "n_correct": ok, "pass_rate": rate})
    report = MiningReport(
        total, len(hard), solved, under, k, sum(rates) / len(rates) if rates else 0.0
    )
    return hard, report
