"""Snippets that attack the sandbox, each with what must happen to it.

Shared by `rstar sandbox demo` (to show people) and the containment tests (to prove it).
`{port}` and `{path}` are filled in by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from rstar.sandbox.result import Status


@dataclass(frozen=True)
class Attack:
    name: str
    code: str
    expect: tuple[Status, ...]
    what: str


ATTACKS = [
    Attack(
        "infinite loop",
        "while True:\n    pass",
        (Status.TIMEOUT,),
        "stopped by the CPU or wall-clock limit",
    ),
    Attack(
        "raise own limits",
        (
            "import resource, signal\nsignal.alarm(0)\nsignal.signal(signal.SIGXCPU, "
            "signal.SIG_IGN)\ntry:\n    resource.setrlimit(resource.RLIMIT_CPU, "
            "(resource.RLIM_INFINITY, resource.RLIM_INFINITY))\nexcept (ValueError, OSError) as "
            "e:\n    print('blocked:', e, flush=True)\nwhile True:\n    pass"
        ),
        (Status.TIMEOUT,),
        "hard limits cannot be raised; SIGXCPU ignored, SIGKILL follows",
    ),
    Attack(
        "memory bomb",
        "chunks = []\nwhile True:\n    chunks.append(' ' * 2**34)",
        (Status.ERROR,),
        "MemoryError at the address-space limit",
    ),
    Attack(
        "fork bomb",
        ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
        (Status.TIMEOUT,),
        "process limit per call uid; all killed at the deadline",
    ),
    Attack(
        "detached sleeper",
        (
            "import os, time\nif os.fork() == 0:\n    os.setsid()\n    "
            "time.sleep(1000)\nprint('parent exits, child detached')"
        ),
        (Status.OK,),
        "the detached child is killed with its call",
    ),
    Attack(
        "output flood",
        "while True:\n    print('x' * 4096)",
        (Status.KILLED,),
        "stopped at the output size limit; the reply is truncated",
    ),
    Attack(
        "write outside",
        "open({path!r}, 'w').write('pwned')",
        (Status.ERROR,),
        "only the private working directory is writable",
    ),
    Attack(
        "network",
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
        (Status.ERROR,),
        "empty network namespace: even loopback is unreachable",
    ),
    Attack(
        "read secrets",
        (
            "import os, glob\nfound = dict(os.environ)\nfor p in "
            "glob.glob('/proc/[0-9]*/environ'):\n    try:\n        found[p] = open(p, "
            "'rb').read().decode(errors='replace')\n    except OSError:\n        pass\nprint(found)"
        ),
        (Status.OK,),
        "scrubbed environment; other processes are invisible",
    ),
    Attack(
        "kill parent",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        (Status.ERROR,),
        "the executor belongs to another uid: EPERM",
    ),
]
