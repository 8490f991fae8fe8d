"""The host-side actuator: the one program that starts or signals an engine on a GPU host.

A Redis fence check in the worker cannot stop a worker that is paused *between* the check and the
action (SIGSTOP, a long GC, a frozen VM) and resumes after another worker took the lease. Only the
host can order the two, so every side effect goes through this script, run on the host as
``python3 -c SOURCE`` (stdlib only, Python 3.8+, no word of it names the engine, so the log scrubber
it starts never looks like one in ``ps``). It reads one JSON request on **stdin** (requests carry
secrets; argv is world-readable) and prints one JSON answer on stdout.

Operations, each under ``flock(LOCK_EX)`` on the host's fence file (``0600``, one per port) held
across the check *and* the action, so a stale actor and a new claimer are strictly ordered:

- ``claim``: store the caller's fencing token if it is higher than the stored one; answer the stored
  value (a higher one means the caller is stale), and this host's clock and boot id, from which the
  worker maps its lease deadline onto the host's clock. Also removes a stale private engine config.
- ``spawn``: refuse unless the stored token equals the caller's; start argv in its own session
  (pid == pgid == sid) with exactly the env given plus a few named basics from this side, stdin
  ``/dev/null``, stdout+stderr through a scrubber into a ``0600`` log; write the engine's private
  config (its API key, or settings it reads from a file only) to a ``0600`` file first. Answers pid,
  pgid, start ticks and the log path.
- ``signal``: refuse on a stale token; signal the pid only if ``/proc/PID/stat`` still shows the
  expected start ticks (a reused pid is never hit), its group only when asked and pgid == pid.
- ``unlink``: remove one of the fence's private files (the engine's config or its kept settings), under
  the same rule as ``spawn``.
- ``descendants``: read-only, no lock: the live descendants (pid, start ticks) of an identified process.

A fence may carry ``until`` and ``boot``: the caller's lease deadline on this host's clock
(``CLOCK_BOOTTIME``, which counts a suspend) and the boot it was mapped in. Every fenced operation but
``claim`` refuses, as stale, once that deadline has passed (or the host rebooted since), even when no
newer job claimed the host yet: a worker that woke just as its lease expired acts on nothing.

Answers: ``{"ok": true, ...}``, or ``{"ok": false, "stale": bool, "error": text}``.
"""

import contextlib
import errno
import fcntl
import json
import os
import signal
import stat
import sys
import time

SIGNALS = {
    "TERM": signal.SIGTERM,
    "KILL": signal.SIGKILL,
    "INT": signal.SIGINT,
    "HUP": signal.SIGHUP,
    "QUIT": signal.SIGQUIT,
    "USR1": signal.SIGUSR1,
    "USR2": signal.SIGUSR2,
    "STOP": signal.SIGSTOP,
    "CONT": signal.SIGCONT,
}
MAX_SCRUB_CONFIG = 60000  # written into a pipe before the scrubber starts: must fit its buffer

# The scrubber: its own small program (exec'd, so it holds no fd of ours), reading the engine's output
# on stdin and writing the log on stdout. It ignores TERM/INT/HUP so it keeps the engine's last words
# after a group TERM, and exits at EOF (when every writer, the engine and its children, is gone); a
# group KILL ends it like the rest of the group. Its settings arrive on the fd named in argv[2].
SCRUBBER = r"""
import json, os, re, signal, sys
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
fd, raw = int(sys.argv[2]), b""
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    raw += chunk
os.close(fd)
cfg = json.loads(raw.decode())
mark = cfg["replacement"]
secrets = sorted({s for s in cfg["secrets"] if s}, key=len, reverse=True)
patterns = [re.compile(p) for p in cfg["patterns"]]
def hide(m):
    g = "val" if "val" in m.re.groupindex else m.re.groups
    a, b = m.span(g)
    v = m.group(g) or ""
    if a < 0 or v.strip("'\"") in ("", "None", "null"):
        return m.group(0)
    q = v[0] if v[0] in "'\"" else ""
    return m.string[m.start():a] + q + mark + q + m.string[b:m.end()]
def clean(data):
    text = data.decode("utf-8", "surrogateescape")
    for s in secrets:
        text = text.replace(s, mark)
    for p in patterns:
        text = p.sub(hide, text)
    return text.encode("utf-8", "surrogateescape")
def put(data):
    data = clean(data)
    while data:
        try:
            data = data[os.write(1, data):]
        except OSError:
            return
hold = b""
while True:
    chunk = os.read(0, 65536)
    if not chunk:
        break
    hold += chunk
    cut = max(hold.rfind(b"\n"), hold.rfind(b"\r")) + 1
    if not cut and len(hold) >= 1 << 20:
        cut = len(hold)
    if cut:
        put(hold[:cut])
        hold = hold[cut:]
put(hold)
"""


class Refused(Exception):
    """An answer of ``ok: false``; ``stale`` when a newer claim holds the host."""

    def __init__(self, message, stale=False):
        super().__init__(message)
        self.stale = stale


# ---- files we create: never through a symlink, never someone else's, never readable by others -------


def expand(path):
    return os.path.abspath(os.path.expanduser(str(path)))


def check_private(fd, path):
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise Refused(f"{path} is not a regular file")
    if info.st_uid != os.geteuid():
        raise Refused(f"{path} belongs to uid {info.st_uid}, not to this user: refusing to use it")
    if info.st_mode & 0o077:
        os.fchmod(fd, 0o600)


def open_private(path, flags):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(f"{path} is a symbolic link: refusing to follow it") from None
        raise Refused(f"cannot open {path}: {exc.strerror}") from None
    try:
        check_private(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path, text):
    """A fresh 0600 file (an old one, or a link planted in its place, is removed first)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        data = text.encode()
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def sibling(fence_path, path):
    """Private engine files live next to the fence file and start with its name: nothing else is touched."""
    path = expand(path)
    if os.path.dirname(path) != os.path.dirname(fence_path) or not os.path.basename(path).startswith(
        os.path.basename(fence_path) + "-"
    ):
        raise Refused(f"{path} is not one of the fence's private files")
    return path


# ---- the fence -----------------------------------------------------------------------------------------


def host_clock():
    """Seconds on this host's boot clock: it runs through a suspend, so a deadline on it is never late."""
    clock = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(clock) if clock is not None else time.monotonic()


def boot_id():
    """This boot's id (a deadline mapped onto the clock of an earlier boot means nothing now)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


#: When this run held the fence lock, on this host's wall clock ([taken, released]): every answer that took it
#: carries it as ``window``, so a history can show that no two actions on one host ever overlapped. A step of the
#: host's wall clock (NTP, an admin's ``date -s``) moves ``window`` with it; ``window_boot``, the same two moments
#: on the boot clock (:func:`host_clock`, which no step moves), keeps them in order.
WINDOW = []  # type: list[float]
WINDOW_BOOT = []  # type: list[float]


class Fence:
    """The fence file, locked for as long as the ``with`` block runs."""

    def __init__(self, spec):
        self.path = expand(spec["path"])
        self.token = int(spec["token"])
        until = spec.get("until")
        self.until = None if until is None else float(until)
        self.boot = str(spec.get("boot") or "")
        self.fd = -1

    def __enter__(self):
        self.fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        WINDOW[:] = [time.time()]
        WINDOW_BOOT[:] = [host_clock()]
        return self

    def __exit__(self, *exc):
        WINDOW.append(time.time())
        WINDOW_BOOT.append(host_clock())
        os.close(self.fd)  # releases the lock (no child holds this fd: it is close-on-exec)

    def stored(self):
        os.lseek(self.fd, 0, os.SEEK_SET)
        text = os.read(self.fd, 64).decode(errors="replace").strip()
        return int(text) if text.isdigit() else 0

    def store(self, token):
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{token}\n".encode())
        os.fsync(self.fd)

    def require_current(self):
        stored = self.stored()
        if stored > self.token:
            raise Refused(
                f"stale fence: {self.path} holds {stored}, newer than this job's {self.token}: "
                "another job holds the host now (or Redis lost its fence counter; then remove "
                "that file once no worker runs)",
                stale=True,
            )
        if stored != self.token:
            raise Refused(f"fence {self.token} was never claimed on this host ({self.path} holds {stored})")
        if self.until is None:
            return
        if self.boot != boot_id():
            raise Refused(f"stale fence: this host rebooted since job fence {self.token} claimed it", stale=True)
        late = host_clock() - self.until
        if late >= 0:
            raise Refused(
                f"stale fence: the lease of fence {self.token} expired {late:.1f} s ago by this host's clock "
                "(its worker was paused or too slow): refusing to act for it",
                stale=True,
            )


# ---- /proc ---------------------------------------------------------------------------------------------


def proc_stat(pid):
    """(state, ppid, pgid, start ticks) from /proc/PID/stat, or None when there is no such process."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return rest[0].decode(), int(rest[1]), int(rest[2]), int(rest[19])


def gone(info):
    return info is None or info[0] in ("Z", "X", "x")


# ---- operations ----------------------------------------------------------------------------------------


def op_claim(req):
    with Fence(req["fence"]) as fence:
        stored = fence.stored()
        if fence.token > stored:
            fence.store(fence.token)
            stored = fence.token
        if stored == fence.token:
            for path in req.get("remove") or ():
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(sibling(fence.path, path))
        clock = host_clock()  # read before the answer leaves; the worker reads its own clock once it arrives
    return {"ok": True, "stored": stored, "clock": clock, "boot": boot_id()}


def op_unlink(req):
    with Fence(req["fence"]) as fence:
        fence.require_current()
        try:
            os.unlink(sibling(fence.path, req["path"]))
        except FileNotFoundError:
            return {"ok": True, "removed": False}
    return {"ok": True, "removed": True}


def engine_env(req):
    """Exactly the env asked for, over a few named basics of this side (PATH, HOME, locale...)."""
    env = {}
    names = set(req.get("inherit") or ())
    prefixes = tuple(req.get("inherit_prefixes") or ())
    for name, value in os.environ.items():
        if name in names or (prefixes and name.startswith(prefixes)):
            env[name] = value
    env.update(req.get("env") or {})
    return env


def op_spawn(req):
    argv = [str(a) for a in req["argv"]]
    if not argv:
        raise Refused("empty command")
    scrub = json.dumps(req.get("scrub") or {"secrets": [], "patterns": [], "replacement": ""}).encode()
    if len(scrub) > MAX_SCRUB_CONFIG:
        raise Refused("too many secrets to scrub")
    with Fence(req["fence"]) as fence:
        fence.require_current()
        log_path = expand(req["log_path"])
        log_fd = open_private(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            private = req.get("private_file")
            if private:
                target = sibling(fence.path, private["path"])
                write_private(target, private["text"])
                # the engine gets the path as this side resolved it (`~`, relative to a cwd it may not share)
                argv = [target if arg == private["path"] else arg for arg in argv]
            pid, scrubber = start(argv, engine_env(req), req.get("cwd") or None, log_fd, scrub)
        finally:
            os.close(log_fd)
        info = proc_stat(pid)  # read before answering: even a process that died at once is still our zombie
    return {
        "ok": True,
        "pid": pid,
        "pgid": pid,
        "start_ticks": info[3] if info else 0,
        "log_path": log_path,
        "log_writer_pid": scrubber,
    }


def start(argv, env, cwd, log_fd, scrub):
    """Fork the engine into a new session with the scrubber beside it; (engine pid, scrubber pid) once both exec'd.

    The engine is the session leader; the scrubber is forked inside that session (double fork, so it is
    not the engine's child and an engine that kills its own children leaves it alone). Exec failures
    come back on a close-on-exec pipe, as subprocess does it.
    """
    out_r, out_w = os.pipe()  # engine stdout+stderr -> scrubber
    cfg_r, cfg_w = os.pipe()  # scrubber settings (secrets): never argv, never env
    err_r, err_w = os.pipe()  # exec errors; EOF once every exec succeeded
    pid_r, pid_w = os.pipe()  # the scrubber's pid, from the process that forks it
    os.write(cfg_w, scrub)
    os.close(cfg_w)
    devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        step = "start the log scrubber"
        try:
            os.setsid()
            helper = os.fork()
            if helper == 0:
                scrubber = os.fork()
                if scrubber:
                    os.write(pid_w, str(scrubber).encode())
                    os._exit(0)
                os.dup2(out_r, 0)
                os.dup2(log_fd, 1)
                os.dup2(devnull, 2)
                os.set_inheritable(cfg_r, True)
                os.execve(
                    sys.executable, [sys.executable, "-I", "-c", SCRUBBER, "benchbot-log-scrubber", str(cfg_r)], {}
                )
            os.waitpid(helper, 0)
            step = f"start {argv[0]!r}"
            if cwd:
                os.chdir(os.path.expanduser(cwd))
            os.dup2(devnull, 0)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores these; the engine must not inherit that
                if hasattr(signal, name):
                    signal.signal(getattr(signal, name), signal.SIG_DFL)
            os.execvpe(argv[0], argv, env)
        except BaseException as exc:  # whatever it was: report it and leave without running our cleanup
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            with contextlib.suppress(OSError):
                os.write(err_w, f"cannot {step}: {reason}".encode())
            os._exit(127)
    for fd in (out_r, out_w, cfg_r, err_w, pid_w, devnull):
        os.close(fd)
    failure, scrubber = read_all(err_r), read_all(pid_r)
    if failure:
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # a scrubber already started would wait for nothing
        raise Refused(failure.decode(errors="replace"))
    return pid, int(scrubber or 0)


def read_all(fd):
    """Everything until EOF (every writer closed or exec'd), then close."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return data


def op_signal(req):
    pid, ticks = int(req["pid"]), int(req["start_ticks"])
    name = str(req["signal"]).upper()
    group = bool(req.get("group"))
    if pid <= 1 or name not in SIGNALS:
        raise Refused(f"refusing to send {name!r} to {pid}")
    with Fence(req["fence"]) as fence:
        fence.require_current()
        info = proc_stat(pid)
        if gone(info):
            return {"ok": True, "outcome": "gone", "reason": "", "detail": f"process {pid} is gone"}
        if info[3] != ticks:
            return {
                "ok": True,
                "outcome": "refused",
                "reason": "reused",
                "detail": f"pid {pid} now belongs to another process (started at tick {info[3]}, "
                f"not {ticks}): left alone",
            }
        if group and info[2] != pid:
            return {
                "ok": True,
                "outcome": "refused",
                "reason": "not_group_leader",
                "detail": f"process {pid} does not lead its own process group (pgid {info[2]}): "
                "its group is not ours to signal",
            }
        try:
            if group:
                os.killpg(pid, SIGNALS[name])
            else:
                os.kill(pid, SIGNALS[name])
        except ProcessLookupError:
            return {"ok": True, "outcome": "gone", "reason": "", "detail": f"process {pid} is gone"}
        except PermissionError:
            return {
                "ok": True,
                "outcome": "refused",
                "reason": "not_permitted",
                "detail": f"not permitted to signal process {pid}",
            }
    what = f"process group {pid}" if group else f"process {pid}"
    return {"ok": True, "outcome": "sent", "reason": "", "detail": f"sent SIG{name} to {what}"}


def op_descendants(req):
    root, ticks = int(req["pid"]), int(req["start_ticks"])
    info = proc_stat(root)
    if gone(info) or info[3] != ticks:
        return {"ok": True, "descendants": []}
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            child = proc_stat(entry)
            if not gone(child):
                children.setdefault(child[1], []).append((int(entry), child[3]))
    found, todo = [], [root]
    while todo:
        for pid, start_ticks in children.get(todo.pop(), ()):
            found.append([pid, start_ticks])
            todo.append(pid)
    return {"ok": True, "descendants": found}


OPERATIONS = {
    "claim": op_claim,
    "spawn": op_spawn,
    "signal": op_signal,
    "unlink": op_unlink,
    "descendants": op_descendants,
}


def main():
    try:
        req = json.loads(sys.stdin.buffer.read().decode())
        answer = OPERATIONS[req["op"]](req)
        if len(WINDOW) == 2:
            answer["window"] = list(WINDOW)
            answer["window_boot"] = list(WINDOW_BOOT)
    except Refused as exc:
        answer = {"ok": False, "stale": exc.stale, "error": str(exc)}
    except (KeyError, TypeError, ValueError) as exc:
        answer = {"ok": False, "stale": False, "error": f"bad request ({type(exc).__name__}: {exc})"}
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        answer = {"ok": False, "stale": False, "error": f"{exc.strerror or exc}{where}"}
    sys.stdout.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main()
