"""Entropy analysis of rollouts: which tokens the policy is most uncertain about.

"Forking" tokens: the most frequent tokens among all model tokens whose entropy is in the
top `quantile` (self-reflection words like "but", "wait" in the paper). "Reflection" tokens:
the same, restricted to the first `window` model tokens after each tool response (reading a
result, diagnosing an error, planning a fix). Reports carry counts and examples in context,
and `compare` lines two reports up (across stages).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass
class EntropyReport:
    threshold: float
    # (token, count among high-entropy)
    forking: list[tuple[str, int]] = field(default_factory=list)
    reflection: list[tuple[str, int]] = field(default_factory=list)
    examples: dict[str, list[str]] = field(default_factory=dict)  # token -> contexts
    model_tokens: int = 0
    after_tool_tokens: int = 0

    def markdown(self, title: str = "Entropy analysis") -> str:
        lines = [
            f"### {title}",
            "",
            f"{self.model_tokens} model tokens; high entropy means >= {self.threshold:.3f} nats; "
            f"{self.after_tool_tokens} tokens right after tool responses.",
            "",
            "| forking token | count | | reflection token | count |",
            "|---|---|---|---|---|",
        ]
        for i in range(max(len(self.forking), len(self.reflection))):
            f = self.forking[i] if i < len(self.forking) else ("", "")
            r = self.reflection[i] if i < len(self.reflection) else ("", "")
            lines.append(f"| `{f[0]!s}` | {f[1]} | | `{r[0]!s}` | {r[1]} |")
        for tok, ctx in list(self.examples.items())[:5]:
            lines += ["", f"`{tok}` in context:", *[f"- …{c}…" for c in ctx]]
        return "\n".join(lines)


def analyze(
    records: list[dict],
    tokenizer,
    *,
    quantile: float = 0.8,
    window: int = 10,
    top: int = 15,
    examples: int = 3,
    context: int = 6,
) -> EntropyReport:
    """Records: rows with response_ids, response_mask and entropies (the trajectories schema)."""
    all_ent = sorted(e for r in records for e, m in zip(r["entropies"], r["response_mask"]) if m)
    if not all_ent:
        return EntropyReport(threshold=0.0)
    threshold = all_ent[min(len(all_ent) - 1, int(quantile * len(all_ent)))]
    forking, reflection = Counter(), Counter()
    contexts: dict[str, list[str]] = defaultdict(list)
    after_tool = 0
    for r in records:
        ids, mask, ent = r["response_ids"], r["response_mask"], r["entropies"]
        since_tool = None  # model tokens seen since the last tool response, None before any
        for i, (t, m, e) in enumerate(zip(ids, mask, ent)):
            if not m:
                since_tool = 0 if i > 0 else None
                continue
            near_tool = since_tool is not None and since_tool < window
            after_tool += near_tool
            if since_tool is not None:
                since_tool += 1
            if e < threshold:
                continue
            word = tokenizer.decode([t]).strip() or tokenizer.decode([t])
            forking[word] += 1
            if near_tool:
                reflection[word] += 1
            if len(contexts[word]) < examples:
                contexts[word].append(
                    tokenizer.decode(ids[max(0, i - context) : i + context + 1]).replace("\n", " ")
                )
    fork_top = forking.most_common(top)
    return EntropyReport(
        threshold,
        fork_top,
        reflection.most_common(top),
        {w: contexts[w] for w, _ in fork_top},
        len(all_ent),
        after_tool,
    )


def compare(reports: dict[str, EntropyReport], top: int = 10) -> str:
    """A markdown table of how often each stage's top forking tokens are high-entropy."""
    tokens = []
    for rep in reports.values():
        tokens += [t for t, _ in rep.forking[:top] if t not in tokens]
    counts = {stage: dict(rep.forking) for stage, rep in reports.items()}
    lines = ["| token | " + " | ".join(reports) + " |", "|---|" + "---|" * len(reports)]
    lines += [
        f"| `{t}` | " + " | ".join(str(counts[s].get(t, 0)) for s in reports) + " |" for t in tokens
    ]
    return "\n".join(lines)
