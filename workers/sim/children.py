"""The simulated engine's child processes: one scheduler per GPU rank, and a detokenizer.

A real ``sglang.launch_server`` keeps HTTP and the tokenizer in its main process and starts one
scheduler process per TP rank (``sglang::scheduler_TP0``, ... set with setproctitle) plus
``sglang::detokenizer``; the GPU memory belongs to the schedulers, so ``nvidia-smi`` lists their pids,
one per GPU, never the main pid. The simulator starts the same tree so that observation has to follow
it: each child is a tiny ``cat`` whose ``argv[0]`` is SGLang's process title, reading a pipe whose
other end only the engine holds. When the engine exits, however it exits (even SIGKILL), the pipe
closes and every child ends by itself, like SGLang's ``kill_itself_when_parent_died``; they share the
engine's process group, so a signal to the group reaches them too.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Child:
    """One child process: its pid, its process title, and the GPU it holds (None: no GPU)."""

    pid: int
    title: str
    gpu: int | None


def scheduler_titles(tp: int, pp: int = 1, ep: int = 1) -> list[str]:
    """SGLang's scheduler titles: ``sglang::scheduler`` + ``_PP{p}`` / ``_TP{t}`` / ``_EP{e}`` when above 1."""
    titles = []
    for p in range(max(1, pp)):
        for t in range(max(1, tp)):
            suffix = (f"_PP{p}" if pp > 1 else "") + (f"_TP{t}" if tp > 1 else "")
            suffix += f"_EP{t // max(1, tp // ep)}" if ep > 1 else ""
            titles.append(f"sglang::scheduler{suffix}")
    return titles


class ChildProcesses:
    """Start the children; ``stop()`` ends them (they also end by themselves when the engine dies)."""

    def __init__(self) -> None:
        self.children: list[Child] = []
        self._procs: list[subprocess.Popen] = []
        self._keep_alive_fd: int | None = None

    def start(
        self, schedulers: list[tuple[str, int | None]], extra_titles: tuple[str, ...] = ("sglang::detokenizer",)
    ) -> list[Child]:
        """One process per ``(title, gpu)`` and one per extra title (no GPU); none when ``cat`` is missing."""
        cat = shutil.which("cat")
        if cat is None or self._procs:
            return self.children
        read_fd, write_fd = os.pipe()  # non-inheritable: only the children get read_fd, as their stdin
        try:
            for title, gpu in [*schedulers, *((t, None) for t in extra_titles)]:
                # close_fds=False lets subprocess use posix_spawn (vfork, then exec at once), which keeps short
                # the moment a new child still shows the engine's own command line (with --port), as SGLang's
                # spawned schedulers do too. Python's descriptors are non-inheritable, so the children still
                # get only these three.
                proc = subprocess.Popen(
                    [title],
                    executable=cat,
                    stdin=read_fd,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    close_fds=False,
                )
                self._procs.append(proc)
                self.children.append(Child(proc.pid, title, gpu))
        finally:
            os.close(read_fd)
        self._keep_alive_fd = write_fd
        return self.children

    def stop(self, timeout: float = 2.0) -> None:
        """Close the pipe (children exit at EOF), then reap them; kill any that linger."""
        if self._keep_alive_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._keep_alive_fd)
            self._keep_alive_fd = None
        for proc in self._procs:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        self._procs.clear()

    def as_registry(self) -> list[dict]:
        """The children as the registry stores them for the nvidia-smi stand-in."""
        return [{"pid": c.pid, "name": c.title, "gpu": c.gpu} for c in self.children]
