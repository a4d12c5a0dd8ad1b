"""Hostile code is contained: each attack gets a clear status, leaves no process behind,
changes nothing on the host, and the service keeps serving."""

import os
import socket
import sys
import threading

import pytest

from rstar.sandbox.hostile import ATTACKS
from rstar.sandbox.result import Status

ATTACK = {a.name: a for a in ATTACKS}


@pytest.fixture
async def still_healthy(sandbox):
    yield
    r = await sandbox.run("print('alive')")
    assert r.status is Status.OK and r.stdout == "alive\n"
    assert sandbox.health()["status"] == "ok"


async def run_attack(sandbox, name, **fmt):
    attack = ATTACK[name]
    r = await sandbox.run(attack.code.format(**fmt), timeout_s=4)
    assert r.status in attack.expect, (r.status, r.reason, r.stderr[-500:])
    return r


async def test_infinite_loop(sandbox, still_healthy, no_leftovers):
    r = await run_attack(sandbox, "infinite loop")
    assert "limit" in r.reason


async def test_cannot_raise_limits_or_cancel_alarms(sandbox, still_healthy, no_leftovers):
    r = await run_attack(sandbox, "raise own limits")
    assert r.stdout.startswith("blocked:")  # the hard limit refused to move
    assert r.cpu_s < sandbox.cfg.cpu_time_s + 1.5


async def test_memory_bomb(sandbox, still_healthy, no_leftovers):
    r = await run_attack(sandbox, "memory bomb")
    assert r.reason.startswith("MemoryError: memory limit")


async def test_fork_bomb_is_bounded_and_fully_killed(sandbox, still_healthy, no_leftovers):
    r = await run_attack(sandbox, "fork bomb")
    assert r.status is Status.TIMEOUT


async def test_detached_children_die_with_their_call(sandbox, still_healthy, no_leftovers):
    r = await run_attack(sandbox, "detached sleeper")
    assert r.stdout == "parent exits, child detached\n"
    # also a detached process started through subprocess, in its own session
    r = await sandbox.run(
        "import subprocess\nsubprocess.Popen(['sleep', '600'], start_new_session=True)\n'spawned'"
    )
    assert r.status is Status.OK and r.value == "'spawned'", r.stderr


async def test_output_flood(sandbox, still_healthy, no_leftovers):
    r = await run_attack(sandbox, "output flood")
    assert "size limit" in r.reason
    assert r.truncated and "[output truncated:" in r.stdout


async def test_writes_outside_the_workdir_fail(sandbox, still_healthy, no_leftovers, tmp_path):
    for target in (tmp_path / "pwned", "/tmp/rstar-pwned", os.path.join(os.getcwd(), "pwned")):
        r = await run_attack(sandbox, "write outside", path=str(target))
        # /tmp is a private empty tmpfs for calls, so a host path there does not even exist
        assert r.reason.split(":")[0] in ("PermissionError", "OSError", "FileNotFoundError"), (
            r.reason
        )
        assert not os.path.exists(target)
    # its own working directory is writable, private, and gone afterwards
    r = await sandbox.run(
        "import os\nopen('mine.txt', 'w').write('ok')\nos.getcwd(), oct(os.stat('.').st_mode & "
        "0o777)"
    )
    assert r.status is Status.OK and r.value.endswith("'0o700')")
    workdir = r.value.split("'")[1]
    r = await sandbox.run(f"import os\nos.path.exists({workdir + '/mine.txt'!r})")
    assert r.value == "False"


async def test_no_network_even_to_loopback(sandbox, still_healthy, no_leftovers):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(3)
    accepted = []
    threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True).start()
    r = await run_attack(sandbox, "network", port=server.getsockname()[1])
    assert "unreachable" in r.reason.lower()
    server.close()
    assert accepted in ([], [None])


def _accept(server):
    try:
        return server.accept()
    except OSError:
        return None


async def test_secrets_in_the_service_environment_stay_hidden(still_healthy, no_leftovers):
    from rstar.sandbox.service import SandboxService
    from tests.sandbox.conftest import small_config

    os.environ["RSTAR_TEST_SECRET"] = "hunter2-s3cr3t"
    try:
        async with SandboxService(small_config(uid_base=310_000, warm_executors=0)) as sb:
            r = await sb.run(ATTACK["read secrets"].code)
    finally:
        del os.environ["RSTAR_TEST_SECRET"]
    assert r.status is Status.OK
    assert "hunter2" not in r.stdout and "RSTAR_TEST_SECRET" not in r.stdout
    assert "/proc/1/environ" not in r.stdout  # other users' processes are invisible


async def test_a_call_sees_only_its_own_processes(sandbox, still_healthy, no_leftovers):
    """/proc inside a call (hidepid=invisible) lists the call's own processes, not the host's
    (about a hundred here, the test runner's among them)."""
    code = (
        "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "lines = [open(f'/proc/{p}/cmdline', 'rb').read() for p in pids]\n"
        "print(len(pids), any(b'pytest' in c for c in lines))"
    )
    r = await sandbox.run(code)
    assert r.status is Status.OK, r.stderr
    seen, runner = r.stdout.split()
    assert int(seen) <= 3 and runner == "False", r.stdout


async def test_every_mount_but_the_calls_scratch_is_read_only(sandbox, still_healthy, no_leftovers):
    """The mount flags themselves, not a write attempt: the calls' uid could not write the
    root-owned files anyway, but in the mode where calls run as the files' owner only the flag
    stops them. /usr, the project's package and the interpreter are read-only; /tmp (the calls'
    tmpfs) and /proc stay writable."""
    import rstar

    r = await sandbox.run(
        "for line in open('/proc/self/mountinfo'):\n    f = line.split()\n    print(f[4], f[5])"
    )
    assert r.status is Status.OK, r.stderr
    mounts = dict(line.split() for line in r.stdout.splitlines())
    package = os.path.dirname(rstar.__file__)
    assert {"/", "/usr", package, sys.base_prefix} <= set(mounts), mounts
    writable = {p for p, opts in mounts.items() if "ro" not in opts.split(",")}
    assert writable == {"/tmp", "/proc"}, mounts


async def test_cannot_kill_the_executor(sandbox, still_healthy, no_leftovers):
    r = await run_attack(sandbox, "kill parent")
    assert "Operation not permitted" in r.reason
    # kill(-1) reaches only processes of the call's own uid (and spares the caller): nothing dies
    r = await sandbox.run("import os, signal\nos.kill(-1, signal.SIGKILL)\n'survived'")
    assert r.status is Status.OK and r.value == "'survived'"


@pytest.fixture
def setuid_id():
    """A setuid-root copy of `id` where calls can see it (inside the bound `rstar` package: a
    file added to a bound directory shows through the bind). Outside the sandbox it makes any
    user root; the fixture checks that first, so the test below cannot pass vacuously."""
    import shutil
    import stat
    import subprocess
    import tempfile

    import rstar

    folder = tempfile.mkdtemp(prefix=".setuid-probe-", dir=os.path.dirname(rstar.__file__))
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "id")
    shutil.copy("/usr/bin/id", path)
    os.chown(path, 0, 0)
    os.chmod(path, stat.S_ISUID | 0o755)
    fd = os.open(path, os.O_RDONLY)  # run through its fd: the checkout may sit in a 0700 folder
    try:
        outside = subprocess.run(
            [f"/proc/self/fd/{fd}"],
            pass_fds=[fd],
            capture_output=True,
            text=True,
            user=65534,
            timeout=10,
        ).stdout
        assert "euid=0" in outside, outside  # on the host, the bit works
        yield path
    finally:
        os.close(fd)
        shutil.rmtree(folder)


async def test_setuid_binaries_grant_nothing(sandbox, still_healthy, no_leftovers, setuid_id):
    r = await sandbox.run(
        f"import subprocess\nsubprocess.run([{setuid_id!r}], capture_output=True, text=True).stdout"
    )
    assert r.status is Status.OK, (r.reason, r.stderr)
    assert "uid=" in r.value and "euid=0" not in r.value  # nosuid: it ran, as the call's uid


async def test_open_files_stop_at_the_limit(sandbox, still_healthy, no_leftovers):
    r = await sandbox.run(
        "import errno, os\nfds = []\ntry:\n    while len(fds) < 5000:\n"
        "        fds.append(os.open('/dev/null', os.O_RDONLY))\nexcept OSError as e:\n"
        "    print(len(fds), errno.errorcode[e.errno])"
    )
    opened, code = r.stdout.split()
    assert code == "EMFILE" and int(opened) < sandbox.cfg.max_open_files


async def test_processes_stop_at_the_limit(sandbox, still_healthy, no_leftovers):
    """RLIMIT_NPROC of the call's uid: forks fail with EAGAIN below max_processes, and the
    children are cleaned up with the call (no_leftovers)."""
    r = await sandbox.run(
        "import errno, os, time\nn = 0\ntry:\n    while n < 500:\n"
        "        if os.fork() == 0:\n            time.sleep(60)\n            os._exit(0)\n"
        "        n += 1\nexcept OSError as e:\n    print(n, errno.errorcode[e.errno])",
        timeout_s=4,
    )
    forked, code = r.stdout.split()
    assert code == "EAGAIN" and int(forked) < sandbox.cfg.max_processes


async def test_all_attacks_at_once(sandbox, still_healthy, no_leftovers, tmp_path):
    from rstar.sandbox.result import ExecRequest

    codes = [a.code.format(port=9, path=str(tmp_path / "x")) for a in ATTACKS]
    results = await sandbox.run_many([ExecRequest(c, timeout_s=4) for c in codes])
    assert [r.status in a.expect for a, r in zip(ATTACKS, results)] == [True] * len(ATTACKS)


async def test_two_services_on_one_host_take_their_own_uids_and_spare_each_others_calls(
    still_healthy,
):
    """Both configured with the same uid_base: the second leases the next block, so the first's
    clean-up (which kills every process of a call's uid) cannot touch the second's calls."""
    import asyncio

    from rstar.sandbox.service import SandboxService
    from tests.sandbox.conftest import small_config

    cfg = small_config(uid_base=420_000)
    async with SandboxService(cfg) as first, SandboxService(cfg) as second:
        starts = [
            {h.uid_start for hs in s.nodes[0].pool.executors.values() for h in hs}
            for s in (first, second)
        ]
        assert not starts[0] & starts[1] and min(starts[1]) >= 421_000
        slow = asyncio.ensure_future(
            second.run("import os, time\ntime.sleep(1.5)\nos.getuid()", timeout_s=10)
        )
        await asyncio.sleep(0.3)
        results = await asyncio.gather(*(first.run("import os\nos.getuid()") for _ in range(12)))
        assert all(r.ok for r in results)
        r = await slow
    assert r.ok and int(r.value) >= 421_000, (r.status, r.reason)
