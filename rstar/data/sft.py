"""Non-reasoning SFT data: teaches the tool-call JSON, reading tool responses, instruction
following and the <reason>/<answer>/\\boxed{} format, on tasks that are NOT the RL problems
(as in the paper, SFT teaches form, not math solutions).

Messages use one neutral, OpenAI-like shape, rendered into the model's chat template later:

    {"role": "user", "content": "..."}
    {"role": "assistant", "content": "<reason>...</reason>",
     "tool_calls": [{"name": ..., "arguments": {...}}]}
    {"role": "tool", "content": "what the sandbox returned"}
    {"role": "assistant", "content": "<reason>...</reason>\\n<answer>... \\\\boxed{...}</answer>"}
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import sys

from rstar.data import check_names
from rstar.data.io import DataError
from rstar.data.notation import expression
from rstar.sandbox.result import ExecResult, Status

TOOL = "execute_python_code_with_standard_io"
ROLES = ("system", "user", "assistant", "tool")
_WORDS = (
    "river",
    "lantern",
    "python",
    "orbit",
    "meadow",
    "crystal",
    "harbor",
    "velvet",
    "summit",
    "thistle",
    "compass",
    "falcon",
    "glacier",
    "ember",
    "quartz",
    "willow",
    "cobalt",
    "saffron",
    "tundra",
    "zephyr",
)


def simulate_tool(code: str, stdin: str = "") -> str:
    """What the sandbox's tool response would say for trusted, generated `code` (run here)."""
    from rstar.sandbox import runner

    try:
        body, last = runner.prepare(code, True)
    except Exception as e:  # noqa: BLE001 - as the sandbox answers code that does not compile
        message, reason = runner.compile_error(e)
        return ExecResult(status=Status.ERROR, stderr=message, reason=reason).tool_text()
    out = io.StringIO()
    saved_stdin = sys.stdin
    try:
        sys.stdin = io.StringIO(stdin)
        with contextlib.redirect_stdout(out):
            ns: dict = {"__name__": "__main__"}
            exec(body, ns)
            value = eval(last, ns) if last is not None else None  # noqa: S307 - generated code
        return ExecResult(
            status=Status.OK,
            stdout=out.getvalue(),
            value=repr(value) if value is not None else None,
        ).tool_text()
    except Exception as e:  # noqa: BLE001 - the generated bug is the point of the example
        return ExecResult(
            status=Status.ERROR,
            stdout=out.getvalue(),
            stderr=runner.trimmed_traceback(e, code),
            reason=f"{type(e).__name__}: {e}",
        ).tool_text()
    finally:
        sys.stdin = saved_stdin


def _call(code: str, stdin: str = "") -> dict:
    return {"name": TOOL, "arguments": {"code": code, "input": stdin}}


def _answer(reason: str, value) -> dict:
    return {
        "role": "assistant",
        "content": f"<reason>{reason}</reason>\n<answer>The answer is \\boxed{{{value}}}.</answer>",
    }


def _with_tool(task: str, plan: str, code: str, read: str, value) -> list[dict]:
    return [
        {"role": "user", "content": task},
        {"role": "assistant", "content": f"<reason>{plan}</reason>", "tool_calls": [_call(code)]},
        {"role": "tool", "content": simulate_tool(code)},
        _answer(read, value),
    ]


def _reverse(rng):
    w = rng.choice(_WORDS)
    return "reverse", _with_tool(
        f"Reverse the string '{w}'.",
        "I will reverse it with Python slicing.",
        f"print('{w}'[::-1])",
        "The tool printed the reversed string.",
        w[::-1],
    )


def _count_letter(rng):
    s = " ".join(rng.sample(_WORDS, 3))
    c = rng.choice(sorted(set(s.replace(" ", ""))))
    return "count_letter", _with_tool(
        f"How many times does the letter '{c}' appear in \"{s}\"?",
        "Counting by hand is error-prone; I will count with Python.",
        f"text = {s!r}\ntext.count({c!r})",
        "The tool returned the count.",
        s.count(c),
    )


def _sort_words(rng):
    ws = rng.sample(_WORDS, 5)
    return "sort_words", _with_tool(
        f"Sort these words alphabetically: {', '.join(ws)}.",
        "I will sort them with Python and join them with commas.",
        f"print(', '.join(sorted({ws!r})))",
        "The tool printed them in order.",
        ", ".join(sorted(ws)),
    )


def _word_count(rng):
    sentence = " ".join(rng.choices(_WORDS, k=rng.randint(4, 12))).capitalize() + "."
    return "word_count", _with_tool(
        f'How many words are in this sentence? "{sentence}"',
        "I will split the sentence on whitespace and count the parts.",
        f"print(len({sentence!r}.split()))",
        "The tool printed the number of words.",
        len(sentence.split()),
    )


def _longest_word(rng):
    ws = rng.sample(_WORDS, 6)
    best = max(ws, key=len)
    return "longest_word", _with_tool(
        f"Which is the longest word in this list: {', '.join(ws)}? If several tie, give the first.",
        "Python's max with key=len keeps the first.",
        f"words = {ws!r}\nmax(words, key=len)",
        "The tool returned the word.",
        best,
    )


def _with_retry(
    task: str, plan: str, bad: str, fix: str, good: str, read: str, value
) -> list[dict]:
    """`task` answered by a call of `bad` code, its error, the reasoning `fix`, a call of `good`
    code and its output read back."""
    return [
        {"role": "user", "content": task},
        {"role": "assistant", "content": f"<reason>{plan}</reason>", "tool_calls": [_call(bad)]},
        {"role": "tool", "content": simulate_tool(bad)},
        {"role": "assistant", "content": f"<reason>{fix}</reason>", "tool_calls": [_call(good)]},
        {"role": "tool", "content": simulate_tool(good)},
        _answer(read, value),
    ]


def _error_recovery(rng):
    w = rng.choice(_WORDS)
    return "error_recovery", _with_retry(
        f"How many characters does the string '{w}' have?",
        "I will measure it with Python.",
        f"print(lenght('{w}'))",
        "The error says the name is misspelled; len is the right function. I will fix the call.",
        f"print(len('{w}'))",
        "After fixing the typo the tool printed the length.",
        len(w),
    )


_PRINT_PLAN, _PRINT_READ = (
    "I will print the value of the expression.",
    "The tool printed the value.",
)

# Slips a first call makes in arithmetic, each a tool error: a misspelt name, a lost or doubled
# closing parenthesis.
_SLIPS = (lambda e: f"prnt({e})", lambda e: f"print({e}", lambda e: f"print({e}))")
_FIX = "The tool reported an error in my code; I will fix it and run it again."


def _arith_recover(rng):
    """Arithmetic in notation whose first call has a slip: the error comes back and the fixed
    call is read back. The SFT model makes such slips itself at about this task's share of
    tool calls; RL then decides whether a correct answer reached through an error is as good
    as a clean one (plain GRPO: yes; RoC: it prefers clean ones)."""
    notation, code = expression(rng, words=False)
    bad = rng.choice(_SLIPS)(code)
    return "arith_recover", _with_retry(
        rng.choice(_ASK_ARITH).format(notation),
        _PRINT_PLAN,
        bad,
        _FIX,
        f"print({code})",
        _PRINT_READ,
        eval(code),  # noqa: S307 - generated arithmetic
    )


def _stdin_echo(rng):
    w = rng.choice(_WORDS)
    code = "s = input()\nprint(s.upper())"
    return "stdin", [
        {
            "role": "user",
            "content": f"Use the tool's standard input to pass the word '{w}' and print it in "
            "capitals.",
        },
        {
            "role": "assistant",
            "content": "<reason>The code reads the word from standard input.</reason>",
            "tool_calls": [_call(code, w)],
        },
        {"role": "tool", "content": simulate_tool(code, w)},
        _answer("The tool printed the capitalised word.", w.upper()),
    ]


def _printed(ask: str, expr: str) -> list[dict]:
    """`ask` answered by printing the Python expression `expr` and reading its value back."""
    value = eval(expr)  # noqa: S307 - generated arithmetic
    return _with_tool(ask, _PRINT_PLAN, f"print({expr})", _PRINT_READ, value)


_ASK_CALC = (
    "Use Python to evaluate {}.",
    "Calculate {} with the tool.",
    "What does Python print for {}?",
    "Run {} in Python and report the value.",
    "Please compute {} exactly, using code.",
)


def _calc(rng):
    """Arithmetic written in Python syntax, operands of one to three digits in any position
    (a model that only saw small second operands breaks its JSON after a long one)."""
    a, b, c, d = (rng.randint(2, 10 ** rng.randint(1, 3) - 1) for _ in range(4))
    # powers of 2-digit bases
    base, e, m = (rng.randint(2, 99), rng.randint(2, 30), rng.randint(7, 99))
    expr = rng.choice(
        [
            f"{a}+{b}",
            f"{a}-{b}",
            f"{a}*{b}",
            f"{a}//{b}",
            f"{a}%{m}",
            f"{base}**{e}",
            f"({a}+{b})*{c}",
            f"{a}*{b}*{c}",
            f"pow({a}, {d}, {m})",
            f"{base}**{d} % {m}",
        ]
    )
    ask = rng.choice(_ASK_CALC)
    return "calc", _printed(ask.format(expr), expr)


def _calc_long(rng):
    """Arithmetic in Python syntax whose value runs to 4-8 digits, mostly 6 (three 2-digit number
    tokens): reading a long result back into \\boxed{} is the copy the tiny model loses first,
    and `calc`'s operands of one to three digits rarely make one."""
    a, b, c = (rng.randint(100, 999) for _ in range(3))
    x, y, z = (rng.randint(11, 99) for _ in range(3))
    expr = rng.choice([f"{a}*{b}", f"{x}*{y}*{z}", f"{a}*{b}+{c}", f"{a}*{b}-{x}", f"{x}**3*{y}"])
    ask = rng.choice(_ASK_CALC)
    return "calc_long", _printed(ask.format(expr), expr)


_ASK_SUM = (
    "Use Python to add up {}.",
    "With the tool, find the sum of {}.",
    "Add these numbers in Python: {}.",
)


def _sum_terms(rng) -> tuple[str, str]:
    """Two to four numbers of two to four digits: (listed in words, their sum in Python)."""
    xs = [rng.randint(10, 10 ** rng.randint(2, 4) - 1) for _ in range(rng.randint(2, 4))]
    return ", ".join(map(str, xs[:-1])) + f" and {xs[-1]}", "+".join(map(str, xs))


def _calc_sum(rng):
    """A sum of two to four numbers listed in words and added by the tool: the pieces of the
    long_sum family (rstar.data.synth, 4/8/16 numbers of 3-4 digits) at up to its level-1
    length, for RL to make reliable. The tiny model copies only operands it was taught
    (docs/benchmarks.md, trial curricula): `calc` stops at three digits and two terms of a sum.
    Two to eight terms (trial 5) made it worse at four and no better at eight."""
    listed, expr = _sum_terms(rng)
    return "calc_sum", _printed(rng.choice(_ASK_SUM).format(listed), expr)


def _calc_sum_recover(rng):
    """calc_sum whose first call has a slip (`_SLIPS`), its error, and the fixed call: the long
    call of a sum is where the tiny model slips, and a correct answer reached through such an
    error is what RoC learns to avoid and plain GRPO rewards like a clean one."""
    listed, expr = _sum_terms(rng)
    return "calc_sum_recover", _with_retry(
        rng.choice(_ASK_SUM).format(listed),
        _PRINT_PLAN,
        rng.choice(_SLIPS)(expr),
        _FIX,
        f"print({expr})",
        _PRINT_READ,
        eval(expr),  # noqa: S307 - generated arithmetic
    )


_ASK_ARITH = (
    "What is {}?",
    "Evaluate {}.",
    "Work out {}.",
    "How much is {}?",
    "Give the value of {}.",
)


def _arith(rng, with_tool: bool):
    """Arithmetic asked in math notation, with no word about tools. A general chat set answers
    such questions sometimes by running code and often straight away, right or not; listing
    `arith_tool` and `arith_direct` in a ratio sets how often the SFT model reaches for the tool
    unprompted, which RL then has to raise where the numbers are too big to do in one's head."""
    notation, code = expression(rng, words=False)
    ask = rng.choice(_ASK_ARITH).format(notation)
    if with_tool:
        return "arith_tool", _printed(ask, code)
    return "arith_direct", [
        {"role": "user", "content": ask},
        _answer("I know this one.", eval(code)),  # noqa: S307 - generated arithmetic
    ]


def _no_tool(rng):
    w = rng.choice(_WORDS)
    kind = rng.randrange(3)
    if kind == 0:
        return "instruction", [
            {
                "role": "user",
                "content": f"Reply with the word '{w}' and nothing else in the answer.",
            },
            _answer("The user asks for one exact word.", w),
        ]
    if kind == 1:
        return "instruction", [
            {"role": "user", "content": f"Write the word '{w}' in capital letters."},
            _answer("Capitalising each letter gives the answer.", w.upper()),
        ]
    return "chat", [
        {"role": "user", "content": f"Hi! Could you tell me the first letter of '{w}'?"},
        _answer("The first letter is the one at the start of the word.", w[0]),
    ]


TASKS = {
    "reverse": _reverse,
    "count_letter": _count_letter,
    "sort_words": _sort_words,
    "word_count": _word_count,
    "longest_word": _longest_word,
    "error_recovery": _error_recovery,
    "stdin": _stdin_echo,
    "calc": _calc,
    "calc_long": _calc_long,
    "calc_sum": _calc_sum,
    "calc_sum_recover": _calc_sum_recover,
    "instruction": _no_tool,
    "arith_tool": lambda rng: _arith(rng, True),
    "arith_direct": lambda rng: _arith(rng, False),
    "arith_recover": _arith_recover,
}


def generate(n: int, *, seed: int = 0, tasks: list[str] | None = None) -> list[dict]:
    """`n` examples, rows of the sft schema, deterministic in `seed`, cycling through `tasks`
    (names of TASKS; all by default)."""
    check_names("SFT task(s)", tasks, TASKS)
    makers = [TASKS[t] for t in (tasks or TASKS)]
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        task, messages = makers[i % len(makers)](rng)
        rows.append(
            {
                "id": f"sft-{seed}-{i:06d}",
                "task": task,
                "source": "synthetic",
                "messages": json.dumps(messages),
            }
        )
    return rows


def normalize_messages(messages, where: str) -> list[dict]:
    """Validate OpenAI-style messages (tool calls as {"type": "function", "function": {...}} with
    JSON-string arguments, or our {"name", "arguments"}) into the neutral shape. Raises DataError
    naming `where` (file and row) and the field."""
    if not isinstance(messages, list) or not messages:
        raise DataError(f"{where}: messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        at = f"{where}: messages[{i}]"
        if not isinstance(m, dict):
            raise DataError(f"{at}: must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise DataError(f"{at}.role: {role!r} is not one of {ROLES}")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise DataError(f"{at}.content: must be a string")
        msg = {"role": role, "content": content}
        calls = m.get("tool_calls") or []
        if calls and role != "assistant":
            raise DataError(f"{at}.tool_calls: only assistant messages call tools")
        norm = []
        for j, c in enumerate(calls):
            fn = c.get("function", c) if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise DataError(f"{at}.tool_calls[{j}]: needs a function name")
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError as e:
                    raise DataError(
                        f"{at}.tool_calls[{j}].arguments: not valid JSON ({e.msg})"
                    ) from None
            if not isinstance(args, dict):
                raise DataError(f"{at}.tool_calls[{j}].arguments: must be a JSON object")
            norm.append({"name": fn["name"], "arguments": args})
        if norm:
            msg["tool_calls"] = norm
        out.append(msg)
    if not any(m["role"] == "assistant" for m in out):
        raise DataError(f"{where}: no assistant message to learn from")
    return out


def load_sft(path: str, *, messages_key: str = "messages") -> list[dict]:
    """Real SFT data (JSONL or Parquet rows with a `messages` list) as rows of the sft schema."""
    from rstar.data.sources import BadRow, read_rows

    rows = []
    for row_id, row in read_rows(path):
        where = f"{path} row {row_id}"
        if isinstance(row, BadRow):
            raise DataError(f"{where}: {row.detail}")
        messages = row.get(messages_key)
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}.{messages_key}: not valid JSON ({e.msg})") from None
        rows.append(
            {
                "id": str(row.get("id", f"{path}#{row_id}")),
                "task": str(row.get("task", "chat")),
                "source": path,
                "messages": json.dumps(normalize_messages(messages, where)),
            }
        )
    return rows
