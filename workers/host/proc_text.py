"""What both transports read from a host's /proc and tools, and how: the listener probe and the parsers.

The same parsing for the local transport (files read in-process) and the SSH one (their text fetched
over the connection), so a host reads the same whichever way it is reached.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

# argv[1] = port. Prints the pid holding a LISTEN socket on that port (any address), or nothing. When several
# hold it (a server and the children that inherited it), the one whose parent does not: the lowest pid is
# not the parent once pids wrap around.
# One implementation for both transports; the SSH transport tries `ss` first and falls back to this.
LISTENER_SCRIPT = """\
import os, sys
port = int(sys.argv[1])
wanted = set()
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    try:
        with open(table) as f:
            rows = f.read().splitlines()[1:]
    except OSError:
        continue
    for row in rows:
        cols = row.split()
        if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
            wanted.add("socket:[%s]" % cols[9])
pids = []
for entry in os.listdir("/proc") if wanted else ():
    if not entry.isdigit():
        continue
    try:
        fds = os.listdir("/proc/%s/fd" % entry)
    except OSError:
        continue
    for fd in fds:
        try:
            if os.readlink("/proc/%s/fd/%s" % (entry, fd)) in wanted:
                pids.append(int(entry))
                break
        except OSError:
            continue
def parent(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None
roots = [p for p in pids if parent(p) not in pids]
print(min(roots or pids) if pids else "")
"""


def parse_listener_output(text: str) -> int | None:
    """The pid LISTENER_SCRIPT printed, or None."""
    text = text.strip()
    return int(text) if text.isdigit() else None


_SS_PID = re.compile(r"pid=(\d+)")


def parse_ss_pids(text: str) -> int | None:
    """Lowest pid in `ss -ltnpH` output (``users:(("python3",pid=123,fd=3))``), or None."""
    pids = [int(m) for m in _SS_PID.findall(text)]
    return min(pids) if pids else None


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat we use."""

    state: str
    pgid: int
    start_ticks: int


def parse_proc_stat(text: str) -> ProcStat:
    """Parse /proc/PID/stat; the command name may hold spaces and parentheses, so split after the last ')'."""
    rest = text[text.rindex(")") + 1 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return ProcStat(state=rest[0], pgid=int(rest[2]), start_ticks=int(rest[19]))


def is_dead_state(state: str) -> bool:
    """Zombie (Z) and dead (X/x) processes count as gone."""
    return state in {"Z", "X", "x"}


def parse_cmdline(data: bytes) -> tuple[str, ...]:
    """NUL-separated /proc/PID/cmdline to argv; empty for kernel threads and zombies."""
    if not data:
        return ()
    if data.endswith(b"\0"):
        data = data[:-1]
    return tuple(part.decode("utf-8", "replace") for part in data.split(b"\0"))


def parse_btime(proc_stat: str) -> int:
    """Boot time (unix seconds) from the `btime` line of /proc/stat."""
    for line in proc_stat.splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    raise ValueError("no btime line in /proc/stat")


def decode_complete_utf8(data: bytes, max_bytes: int) -> tuple[str, int]:
    """Decode what is complete; returns the text and how many bytes it used (a cut character waits).

    With ``max_bytes`` under 4 a cut character could never fit, so it is replaced instead of waiting.
    """
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    text = decoder.decode(data, final=False)
    pending = len(decoder.getstate()[0])
    if pending and max_bytes < 4:
        return text + decoder.decode(b"", final=True), len(data)
    return text, len(data) - pending


def decode(data: bytes) -> str:
    """Command output as text; bad bytes become U+FFFD instead of an exception."""
    return data.decode("utf-8", "replace")


def shell_returncode(code: int | None) -> int:
    """Death by signal N reads as 128+N, as a shell (and so an SSH host) reports it; unknown is -1."""
    if code is None:
        return -1
    return 128 - code if code < 0 else code
