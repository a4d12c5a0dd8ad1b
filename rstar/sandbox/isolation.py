"""Set-up of an executor's isolation, run once before it serves:
`python -m rstar.sandbox.isolation FLAVOUR UID_START FD` enters the namespaces and then
execs the executor, so the executor itself never loads ctypes (a lean parent forks faster).

- an empty network namespace (no interface is up; nothing is reachable);
- a private mount namespace whose root is a minimal tree built for the calls: read-only,
  nosuid binds of only what Python needs (the system's /usr and /lib, the interpreter's and the
  virtual environment's prefixes, the `rstar` package, /etc/ld.so.cache, a few /dev nodes), a
  fresh tmpfs /tmp and /dev/shm, and /proc hiding other users' processes. The rest of the host
  is not there: not /etc/passwd, not the project's checkout, configs, datasets (answers
  included: in agentic RL, a readable training file is a way to earn reward without solving
  anything) or checkpoints, not the home directory a venv may live under;
- the executor is a child subreaper, so processes a call orphans are re-parented to it.
"""

from __future__ import annotations

import ctypes
import os
import sys

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    1 << 12,
    1 << 14,
    1 << 18,
)
_KEEP_FLAGS = {
    "ro": MS_RDONLY,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": 1 << 10,
    "nodiratime": 1 << 11,
    "relatime": 1 << 21,
    "strictatime": 1 << 24,
}
PR_SET_CHILD_SUBREAPER = 36
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
HUGE = 1 << 21

WORK_ROOT = "/tmp/rstar-calls"
NEW_ROOT = (
    "/tmp/.rstar-sandbox-root"  # a mount point on the host; each executor mounts its own root there
)
# What every call may read, besides the interpreter's own paths (interpreter_paths).
SYSTEM_PATHS = (
    "/usr",
    "/lib",
    "/lib64",
    "/lib32",
    "/bin",
    "/sbin",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
)
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}  # syscall numbers: glibc has no wrapper
MNT_DETACH = 2
# the calls' tmpfs (not what is bound into it); /proc/self/oom_score_adj
_STAY_WRITABLE = ("/tmp", "/proc")


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(
    source: str, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def privileged() -> bool:
    return os.geteuid() == 0


def _bind_into(root: str, path: str) -> None:
    """`path` of the host at the same place under `root`: a symlink as a symlink, a directory or
    file as a recursive bind mount (made read-only later, with every other mount)."""
    target = root + path
    os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
    if os.path.islink(path):
        os.symlink(os.readlink(path), target)
        return
    if os.path.isdir(path):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        open(target, "w").close()
    _mount(path, target, None, MS_BIND | MS_REC)


def _minimal_paths(paths: list[str]) -> list[str]:
    """Existing paths, each once: none under another already listed (its bind covers it)."""
    out: list[str] = []
    for p in sorted({os.path.normpath(p) for p in paths if os.path.lexists(p)}, key=len):
        if not any(
            p == q or p.startswith(q.rstrip("/") + "/") for q in out if not os.path.islink(q)
        ):
            out.append(p)
    return out


def _pivot_into(root: str) -> None:
    os.chdir(root)
    os.mkdir(".old")
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is None:
        raise OSError(f"no pivot_root syscall number known for {os.uname().machine}")
    _check(_libc.syscall(number, b".", b".old"), "pivot_root")
    os.chdir("/")
    _check(_libc.umount2(b"/.old", MNT_DETACH), "umount old root")
    os.rmdir("/.old")


def _build_root(workdir_mb: int, paths: list[str]) -> list[str]:
    """The calls' root (module docstring), then pivot into it."""
    warnings = []
    os.makedirs(NEW_ROOT, mode=0o755, exist_ok=True)
    _mount("tmpfs", NEW_ROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    # first: a checkout in /tmp binds on top
    for path, size in (("/tmp", f"{workdir_mb}m"), ("/dev/shm", "1m")):
        os.makedirs(NEW_ROOT + path, mode=0o755, exist_ok=True)
        _mount("tmpfs", NEW_ROOT + path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=0755,size={size}")
    for path in _minimal_paths([*SYSTEM_PATHS, *paths]):
        _bind_into(NEW_ROOT, path)
    os.makedirs(NEW_ROOT + "/proc", mode=0o555, exist_ok=True)
    try:
        _mount(
            "proc",
            NEW_ROOT + "/proc",
            "proc",
            MS_NOSUID | MS_NODEV | MS_NOEXEC,
            "hidepid=invisible",
        )
    except OSError as e:  # not our pid namespace (unprivileged): the host's, as it is
        warnings.append(f"/proc not mounted with hidepid: {e}")
        _mount("/proc", NEW_ROOT + "/proc", None, MS_BIND | MS_REC)
    _pivot_into(NEW_ROOT)
    return warnings


def _mounts() -> list[tuple[str, set[str]]]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 and friends
            out.append((point, set(fields[5].split(","))))
    return out


def _lock_down_mounts() -> list[str]:
    """Every mount read-only and nosuid, except the calls' tmpfs and /proc."""
    failed = []
    for point, opts in _mounts():
        flags = MS_BIND | MS_REMOUNT | MS_NOSUID
        for name, bit in _KEEP_FLAGS.items():
            if name in opts:
                flags |= bit
        if point not in _STAY_WRITABLE:
            flags |= MS_RDONLY
        try:
            _mount("none", point, None, flags)
        except OSError:
            failed.append(point)
    return [f"could not make {failed} read-only and nosuid"] if "/" in failed else []


def enter_namespaces(workdir_mb: int, expose: list[str]) -> list[str]:
    """`expose`: what calls may read besides SYSTEM_PATHS (interpreter_paths)."""
    """Enter the namespaces described in the module docstring. Returns warnings for what the
    kernel or our privileges did not allow."""
    warnings: list[str] = []
    if privileged():
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(mount, net)")
    else:
        uid, gid = os.geteuid(), os.getegid()
        try:
            _check(
                _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET),
                "unshare(user, mount, net)",
            )
            for path, text in (
                ("/proc/self/setgroups", "deny"),
                ("/proc/self/uid_map", f"0 {uid} 1"),
                ("/proc/self/gid_map", f"0 {gid} 1"),
            ):
                with open(path, "w") as f:
                    f.write(text)
        except OSError as e:
            return [
                f"no network or mount namespace ({e}): calls can reach the network and write to "
                "shared directories such as /tmp"
            ]
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    warnings += _build_root(workdir_mb, expose)
    warnings += _lock_down_mounts()
    os.makedirs(WORK_ROOT, mode=0o711, exist_ok=True)
    return warnings


def collapse_to_huge_pages() -> int:
    """Back the anonymous memory of a warm parent with 2 MiB pages. fork() then copies a few
    page-middle entries instead of thousands of page-table entries (2-3x cheaper forks)."""
    collapsed = 0
    with open("/proc/self/maps") as f:
        maps = f.read().splitlines()
    for line in maps:
        parts = line.split()
        perms, path = parts[1], (parts[5] if len(parts) > 5 else "")
        if not perms.startswith("rw") or (path and path != "[heap]"):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        start, end = (start + HUGE - 1) & ~(HUGE - 1), end & ~(HUGE - 1)
        if end > start:
            _libc.madvise(start, end - start, MADV_HUGEPAGE)
            if _libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
                collapsed += (end - start) // HUGE
    return collapsed


def interpreter_paths() -> list[str]:
    """What an executor and its calls need to run Python and import libraries: the interpreter's
    and the virtual environment's prefixes, and of the project only its `rstar` package (the
    executor's code), never the checkout around it."""
    project = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    package = os.path.join(project, "rstar")
    # Started with -S, a venv's python reports the base prefix: find the venv from the executable
    venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    paths = [
        os.path.realpath(sys.executable),
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        package,
    ]
    if os.path.exists(os.path.join(venv, "pyvenv.cfg")):
        # the path it was started by, and where it really is
        paths += [venv, os.path.realpath(venv)]
    # sys.path also holds the working directory ("/" here, for -m) and the project root: not those
    return paths + [
        p for p in sys.path if p and os.path.realpath(p) not in ("/", os.path.realpath(project))
    ]


def main(argv: list[str]) -> None:
    """Isolate, then become the executor. Warnings travel in the environment to its hello."""
    workdir_mb = int(argv[0])
    try:
        warnings = enter_namespaces(workdir_mb, interpreter_paths())
    except OSError as e:
        warnings = [f"namespaces unavailable: {e}"]
    _check(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), "prctl(CHILD_SUBREAPER)")
    env = dict(os.environ, RSTAR_SANDBOX_WARNINGS="\n".join(warnings))
    flavour = argv[1]
    # A lean executor skips site-packages processing (-S): fewer modules, cheaper forks.
    flags = ["-S"] if flavour == "lean" else []
    os.execve(
        sys.executable, [sys.executable, *flags, "-m", "rstar.sandbox.executor", *argv[1:]], env
    )


if __name__ == "__main__":
    main(sys.argv[1:])
