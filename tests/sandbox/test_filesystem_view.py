"""What a call can read: a minimal tree (the interpreter, its libraries, the `rstar` package),
nothing of the host's or the project's files. In agentic RL a readable training file is a way to
earn reward without solving anything; /etc/passwd and the checkout were readable before."""

import json
import os
import subprocess
import sys

import pytest

from rstar.sandbox.isolation import privileged

pytestmark = pytest.mark.skipif(
    not privileged(), reason="the minimal root needs the service to run as root"
)

PROJECT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def test_a_call_reads_no_host_or_project_file(sandbox, tmp_path):
    answers = tmp_path / "train_problems.jsonl"
    answers.write_text(json.dumps({"problem": "2+2", "answer": "4"}) + "\n")
    for path in (
        str(answers),
        os.path.join(PROJECT, "configs", "tiny.yaml"),
        "/etc/passwd",
        os.path.join(PROJECT, "models", "tiny-base", "MANIFEST.json"),
    ):
        assert os.path.exists(path)
        r = await sandbox.run(f"open({path!r}).read()")
        assert r.reason.startswith(("FileNotFoundError", "PermissionError")), (
            path,
            r.status,
            r.reason,
            r.value,
        )
    r = await sandbox.run(f"sorted(__import__('os').listdir({PROJECT!r}))")
    # the executor's own code (and a venv), no data
    assert set(eval(r.value)) <= {"rstar", ".venv"}, r.value
    # what calls need still works
    r = await sandbox.run("import json, fractions, math; math.comb(50, 25)")
    assert r.value == "126410606437752"


def test_the_sandbox_starts_from_a_venv_under_a_private_directory(tmp_path):
    """The usual place for a venv is a home directory of mode 700; the executor, started with
    -S, did not find the venv there and the service exited."""
    private = tmp_path / "home"
    private.mkdir(mode=0o700)
    venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    # the same environment, reached through the private directory
    (private / "venv").symlink_to(venv)
    python = str(private / "venv" / "bin" / os.path.basename(sys.executable))
    code = (
        "import asyncio\nfrom rstar.sandbox.service import embedded_sandbox\nasync def main():\n   "
        " async with embedded_sandbox() as sb:\n        print((await sb.run('6 * 7')).value)\nif "
        "__name__ == '__main__':\n    asyncio.run(main())\n"
    )
    out = subprocess.run(
        [python, "-c", code], capture_output=True, text=True, timeout=300, cwd=PROJECT
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "42", out.stdout
