"""The sandbox's first process: isolates itself, then runs the test harness under resource limits.

Run as ``python -I -S _launcher.py SPEC_JSON`` by `runner.run_program` (a script, so it imports only
the standard library). With ``isolate`` set it makes new user, network, mount and pid namespaces
(the network has only a loopback that is down; the filesystem is read-only but for a private tmpfs
working directory; /proc shows only the sandbox's processes), forks the harness as the namespace's
pid 1 (when it dies the kernel kills every process left in the namespace), drops to an unprivileged
id so ``exec`` clears every capability, and forbids new processes with a seccomp filter (threads are
allowed). Without ``isolate`` only the limits apply. A setup step that fails exits with status 120
and names the step on stderr: isolation is never claimed and then skipped.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import signal
import struct
import sys

SETUP_FAILED = 120
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
INNER_ID = 1000  # the sandbox's uid and gid inside its user namespace: not 0, so exec drops capabilities
# seccomp: x86_64 and aarch64 syscall numbers of process creation, and their audit arch
_SYSCALLS = {"x86_64": (0xC000003E, 56, 57, 58, 435), "aarch64": (0xC00000B7, 220, None, None, 435)}
_CLONE_THREAD = 0x10000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


class SetupError(Exception):
    """A step of the isolation failed (its name and the errno's text)."""


def _call(step: str, result: int) -> None:
    if result != 0:
        raise SetupError(f"{step}: {os.strerror(ctypes.get_errno())}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces() -> None:
    """New user, network, mount and pid namespaces; this process's ids map to INNER_ID inside."""
    uid, gid = os.geteuid(), os.getegid()
    _call("unshare", _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS | CLONE_NEWPID))
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{INNER_ID} {uid} 1")
    _write("/proc/self/gid_map", f"{INNER_ID} {gid} 1")


def read_only_root(workdir: str, disk_mb: int) -> None:
    """Every mount read-only, then a private tmpfs of `disk_mb` MB on `workdir` (the only writable place)."""
    _call("mount --make-rprivate /", _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None))
    _set_read_only(b"/")
    options = f"size={disk_mb}m,mode=0700,uid={INNER_ID},gid={INNER_ID}".encode()
    _call("mount tmpfs", _libc.mount(b"tmpfs", workdir.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options))


def _set_read_only(path: bytes) -> None:
    """mount_setattr(AT_RECURSIVE, MOUNT_ATTR_RDONLY) on `path` and every mount below it."""
    attr = struct.pack("QQQQ", 1, 0, 0, 0)  # attr_set = MOUNT_ATTR_RDONLY
    number = {"x86_64": 442, "aarch64": 442}.get(platform.machine())
    if number is None:
        raise SetupError(f"mount_setattr: unknown syscall number on {platform.machine()}")
    _libc.syscall.restype = ctypes.c_long
    result = _libc.syscall(ctypes.c_long(number), ctypes.c_int(-100), path, ctypes.c_uint(0x8000),
                           ctypes.c_char_p(attr), ctypes.c_size_t(len(attr)))  # fmt: skip
    _call("mount_setattr read-only", int(result))


def mount_proc() -> None:
    """A /proc of the new pid namespace (the host's processes, and their environments, out of sight)."""
    _call("mount proc", _libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None))


def forbid_processes() -> None:
    """A seccomp filter: fork, vfork and clone without CLONE_THREAD fail with EAGAIN; clone3 with ENOSYS
    (so the C library falls back to clone for threads). Must be the last step before exec."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        raise SetupError(f"seccomp: no syscall table for {platform.machine()}")
    arch, clone, fork, vfork, clone3 = numbers
    allow, eagain, enosys = 0x7FFF0000, 0x00050000 | 11, 0x00050000 | 38
    ld, jeq, jset, ret = 0x20, 0x15, 0x45, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, JMP|JSET|K, RET|K
    forks = [n for n in (fork, vfork) if n is not None]
    jge, eperm = 0x35, 0x00050000 | 1
    # another ABI's syscall (i386, x32) could fork around the table: refused whole
    program = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, eperm), (ld, 0, 0, 0)]
    program += [(jge, 0, 1, 0x40000000), (ret, 0, 0, eperm)]
    program += [(jeq, 0, 1, clone3), (ret, 0, 0, enosys)]
    for n in forks:
        program += [(jeq, 0, 1, n), (ret, 0, 0, eagain)]
    program += [(jeq, 0, 3, clone), (ld, 0, 0, 16), (jset, 1, 0, _CLONE_THREAD), (ret, 0, 0, eagain)]
    program += [(ret, 0, 0, allow)]
    filters = b"".join(struct.pack("HBBI", *op) for op in program)
    buffer = ctypes.create_string_buffer(filters)
    fprog = struct.pack("HxxxxxxQ", len(program), ctypes.addressof(buffer))
    _libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong]
    _call("no_new_privs", _libc.prctl(38, 1, None, 0, 0))
    _call("seccomp", _libc.prctl(22, 2, fprog, 0, 0))


def apply_limits(spec: dict[str, int]) -> None:
    """The resource limits of the spec (CPU seconds, address space, file size, processes, open files)."""
    cpu = spec["cpu_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at cpu, SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_AS, (spec["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (spec["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (spec["processes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (spec["open_files"],) * 2)


def _exit_like(status: int) -> None:
    """End as the harness did: its exit code, or the signal that killed it (so the runner reads one
    status whether or not the harness ran in a namespace of its own)."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
    os._exit(os.WEXITSTATUS(status))


def main() -> None:
    spec = json.loads(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a harness killed by SIGXCPU dumps no core here
    argv = [sys.executable, "-I", "-S", "-B", spec["harness"], *spec["harness_args"]]
    try:
        if spec["isolate"]:
            enter_namespaces()
            read_only_root(spec["workdir"], spec["disk_mb"])
            pid = os.fork()
            if pid:  # outside the new pid namespace: wait for its pid 1 and exit as it did
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                _exit_like(os.waitpid(pid, 0)[1])
            mount_proc()
        os.chdir(spec["workdir"])
        apply_limits(spec["limits"])
        if spec["isolate"]:
            forbid_processes()
    except (SetupError, OSError, ValueError) as exc:
        sys.stderr.write(f"sandbox setup failed: {exc}\n")
        os._exit(SETUP_FAILED)
    os.execv(sys.executable, argv)  # the environment is the minimal one the runner gave


if __name__ == "__main__":
    main()
