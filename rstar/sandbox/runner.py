"""How a snippet runs: compiled once in the executor, executed in the forked call process.

Notebook semantics: when the last statement is a bare expression its value is
reported separately (like a Jupyter cell). Tracebacks are trimmed to the frames
that help a model fix its code. Compiling before the fork matters for speed: the
child then allocates almost nothing, and every page it touches costs a copy.
"""

from __future__ import annotations

import _ast
import linecache
import os
import sys
import traceback

FILENAME = "<code>"
_ONLY_AST = 0x400  # ast.PyCF_ONLY_AST, without importing the ast module into the lean executor
_KEEP_LIBRARY_FRAMES = 2


def prepare(code: str, notebook: bool):
    """Compile `code`: (body, final expression or None). Raises what compile() raises."""
    if not notebook:
        return compile(code, FILENAME, "exec", dont_inherit=True), None
    tree = compile(code, FILENAME, "exec", _ONLY_AST, dont_inherit=True)
    last = None
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = compile(_ast.Expression(tree.body.pop().value), FILENAME, "eval", dont_inherit=True)
    return compile(tree, FILENAME, "exec", dont_inherit=True), last


def compile_error(exc: BaseException) -> tuple[str, str]:
    """(stderr, one-line reason): how a snippet that does not compile is answered."""
    message = "".join(traceback.format_exception_only(type(exc), exc))
    return message, message.strip().splitlines()[-1]


def trimmed_traceback(exc: BaseException, code: str) -> str:
    """The snippet's own frames, then at most the innermost library frames where it failed."""
    linecache.cache[FILENAME] = (len(code), None, code.splitlines(True), FILENAME)
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    last_user = max((i for i, f in enumerate(frames) if f.filename == FILENAME), default=-1)
    head = [f for f in frames[: last_user + 1] if f.filename == FILENAME]
    tail = frames[last_user + 1 :]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(head)]
    if len(tail) > _KEEP_LIBRARY_FRAMES:
        lines.append(f"  ... {len(tail) - _KEEP_LIBRARY_FRAMES} library frames omitted ...\n")
        tail = tail[-_KEEP_LIBRARY_FRAMES:]
    lines += traceback.format_list(tail)
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines)


def run(code: str, body, last, meta_fd: int, max_value_chars: int) -> int:
    """Execute a prepared snippet as __main__ and return the process exit code. The final
    value goes to `meta_fd` as b"V" + repr, an uncaught error as b"E" + its one-line summary."""
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    meta = b""
    exit_code = 0
    try:
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)  # noqa: S307 - running the snippet is the point
            if value is not None:
                text = repr(value)
                if len(text) > max_value_chars:
                    text = (
                        text[:max_value_chars]
                        + f"... [value truncated: {len(text) - max_value_chars} more chars]"
                    )
                meta = b"V" + text.encode("utf-8", "replace")
    except SystemExit as e:
        if isinstance(e.code, int):
            exit_code = e.code & 0xFF
        elif e.code is not None:
            print(e.code, file=sys.stderr)  # noqa: T201 - as Python shows sys.exit("message")
            exit_code = 1
    except BaseException as e:  # noqa: BLE001 - everything the snippet raises is its result
        sys.stderr.write(trimmed_traceback(e, code))
        summary = traceback.format_exception_only(type(e), e)[-1].strip()
        meta = b"E" + summary.encode("utf-8", "replace")[:1000]
        exit_code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed or broken stream must not hide the result
                pass
    if meta:
        os.write(meta_fd, meta)
    return exit_code
