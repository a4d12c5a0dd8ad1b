"""Set-up of an executor's isolation, run once before it serves:
`python -m rstar.sandbox.isolation FLAVOUR UID_START FD` enters the namespaces and then
execs the executor, so the executor itself never loads ctypes (a lean parent forks faster).

- an empty network namespace (no interface is up; nothing is reachable);
- a private mount namespace where every mount is read-only and nosuid, the shared
  writable directories (/tmp, /dev/shm, ...) are fresh root-owned tmpfs, /proc hides other
  users' processes, and private directories the interpreter lives under (/root, say) are
  replaced by traverse-only tmpfs with just the interpreter bound back in;
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
    1, 2, 4, 8, 32, 1 << 12, 1 << 14, 1 << 18)
_KEEP_FLAGS = {"ro": MS_RDONLY, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": 1 << 10,
               "nodiratime": 1 << 11, "relatime": 1 << 21, "strictatime": 1 << 24}
PR_SET_CHILD_SUBREAPER = 36
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
HUGE = 1 << 21

# World-writable places an unprivileged uid could otherwise write to on the host.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
WORK_ROOT = "/tmp/rstar-calls"
_STAY_WRITABLE = ("/tmp", "/proc")  # the calls' tmpfs (not what is bound into it); /proc/self/oom_score_adj


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(_libc.mount(source.encode(), target.encode(), fstype.encode() if fstype else None,
                       flags, data.encode() if data else None), f"mount {target}")


def privileged() -> bool:
    return os.geteuid() == 0


def _hidden_ancestor(path: str) -> tuple[str, str] | None:
    """The first directory on `path` that other users cannot traverse, and its child on `path`."""
    parts = os.path.realpath(path).split("/")[1:]
    for i in range(1, len(parts)):
        parent = "/" + "/".join(parts[:i])
        if not os.stat(parent).st_mode & 0o001:
            return parent, parent + "/" + parts[i]
    return None


def _replace_with_tmpfs(directory: str, keep: set[str], options: str) -> None:
    """Mount a fresh tmpfs on `directory`, binding the paths in `keep` (its children) back in."""
    fds = {child: os.open(child, os.O_PATH) for child in keep}
    try:
        _mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, options)
        for child, fd in fds.items():
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.mkdir(child)
            else:
                open(child, "w").close()
            _mount(f"/proc/self/fd/{fd}", child, None, MS_BIND | MS_REC)
    finally:
        for fd in fds.values():
            os.close(fd)


def _children_on_paths(directory: str, paths: list[str]) -> set[str]:
    """The children of `directory` that lie on one of `paths`."""
    prefix = directory.rstrip("/") + "/"
    return {prefix + p[len(prefix):].split("/")[0] for p in map(os.path.realpath, paths) if p.startswith(prefix)}


def _expose(paths: list[str]) -> list[str]:
    """Make `paths` reachable for unprivileged calls when they live under a private directory:
    a traverse-only tmpfs replaces that directory, with only the needed subtrees bound back."""
    needed: dict[str, set[str]] = {}
    for path in paths:
        if os.path.exists(path) and (hit := _hidden_ancestor(path)):
            needed.setdefault(hit[0], set()).add(hit[1])
    warnings = []
    for hidden, children in needed.items():
        try:
            _replace_with_tmpfs(hidden, children, "mode=0711,size=64k")
        except OSError as e:
            warnings.append(f"could not expose {sorted(children)} to calls: {e}")
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
    """Enter the namespaces described in the module docstring. Returns warnings for what the
    kernel or our privileges did not allow."""
    warnings: list[str] = []
    if privileged():
        _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(mount, net)")
    else:
        uid, gid = os.geteuid(), os.getegid()
        try:
            _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET), "unshare(user, mount, net)")
            for path, text in (("/proc/self/setgroups", "deny"), ("/proc/self/uid_map", f"0 {uid} 1"),
                               ("/proc/self/gid_map", f"0 {gid} 1")):
                with open(path, "w") as f:
                    f.write(text)
        except OSError as e:
            return [f"no network or mount namespace ({e}): calls can reach the network "
                    "and write to shared directories such as /tmp"]
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    if privileged():
        warnings += _expose(expose)
    for path in SHARED_WRITABLE:
        if os.path.isdir(path):
            size = f"{workdir_mb}m" if path == "/tmp" else "1m"
            try:  # the interpreter or project may live here (a checkout in /tmp, say): keep those
                _replace_with_tmpfs(path, _children_on_paths(path, expose), f"mode=0755,size={size}")
            except OSError as e:
                warnings.append(f"could not hide {path}: {e}")
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
    except OSError as e:
        warnings.append(f"/proc not remounted with hidepid: {e}")
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
    """What a call needs to read to run Python and import libraries."""
    return [os.path.realpath(sys.executable), sys.prefix, sys.base_prefix] + [p for p in sys.path if p]


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
    os.execve(sys.executable, [sys.executable, *flags, "-m", "rstar.sandbox.executor", *argv[1:]], env)


if __name__ == "__main__":
    main(sys.argv[1:])
