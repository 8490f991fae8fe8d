"""``make demo``: the seed's session replayed through the dispatcher Slack uses, on a simulated host.

It starts a private Redis, real worker processes and a simulated 8 x RTX PRO 6000 (SM120) host,
then plays the story: the baseline and its bench, NEXTN and a teammate queued behind it, a
flashinfer_trtllm launch that dies, a cutedsl launch caught answering ``!!!!``, a server swapped
behind the bot's back and ``/status`` telling the truth, a bench that refuses to measure under a
wrong label, ``/compare``, a sweep with an accuracy check per config (the degraded FP4 GEMM flagged), and
``/stop``; then a short vLLM chapter on a second simulated host (``vllm-1``): launch and bench in vLLM's
words, and ``/compare`` against the SGLang baseline; a short discussion in a job's thread
(``@benchbot compare baseline``, a note, ``tag``, ``notes``); last, a two-trial ``/tune`` of the FP4 GEMM
that refuses the fast-but-wrong one and names the winner with its ``/launch`` line. Plots, the
transcript and the results land in the output directory; every process it started is gone when it returns.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import redis

from bot import thread_talk
from bot.dispatch import Dispatcher
from bot.follow import EventRecord, follow_job
from bot.replies import Reply
from workers import keys, redis_conn
from workers.config import EMBEDDED_TOML, SEED_PRESETS_TOML, load_config
from workers.host import simulated
from workers.host.local import LocalTransport
from workers.jobs import events
from workers.jobs.outcomes import BenchOutcome, LaunchOutcome, parse_outcome
from workers.ports import free_local_port
from workers.results import export, notes

CHANNEL = "C-gpu-bench"
#: Questions per accuracy check: enough for the degraded FP4 path's 7 misses to be flagged (docs/eval.md),
#: few enough to take about a second on the simulator.
EVAL_N = 60


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc), so a stuck job process never outlives the demo."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            found += [int(x) for x in (task / "children").read_text().split()]
    return found


def demo_config(port: int, log_dir: Path, vllm_port: int | None = None) -> str:
    """The demo's benchbot.toml: the embedded presets on simulated host gpu-1 (SGLang) and vllm-1 (vLLM)."""
    # The embedded group (pair-a, pair-b: the file's last section) is left out: the demo serves two hosts, and
    # two more that no worker serves would only stand in its /status and /queue as "no worker is serving".
    hosts = EMBEDDED_TOML.removesuffix(SEED_PRESETS_TOML)  # the embedded file, then the seed's presets
    text = hosts.split("\n# A group:", 1)[0] + "\n" + SEED_PRESETS_TOML
    text = text.replace('default_host = "sim"', 'default_host = "gpu-1"')
    text = text.replace("[hosts.sim]", "[hosts.gpu-1]").replace("port = 30000", f"port = {port}")
    text = text.replace("[hosts.sim-vllm", "[hosts.vllm-1").replace("port = 8000", f"port = {vllm_port or port + 1}")
    text = text.replace("launch_timeout_s = 120", "launch_timeout_s = 60")
    text = text.replace('description = "simulated', f'log_dir = "{log_dir}"\ndescription = "simulated')
    text = text.replace('description = "vLLM on', f'log_dir = "{log_dir}"\ndescription = "vLLM on')
    # All of an eval's questions in one wave: a short accuracy check takes about a second on the simulator.
    return text + f"\n[limits]\nlease_ttl_s = 30\ncancel_grace_s = 5\n\n[eval]\nn = {EVAL_N}\nconcurrency = {EVAL_N}\n"


class Transcript:
    """Prints a Slack-like transcript and keeps a copy for the output directory."""

    def __init__(self, emit: Callable[[str], None] = print) -> None:
        self.lines: list[str] = []
        self._emit = emit

    def say(self, text: str = "") -> None:
        self.lines.append(text)
        self._emit(text)

    def chapter(self, title: str, story: str) -> None:
        self.say()
        self.say(f"=== {title} " + "=" * max(0, 70 - len(title)))
        for line in textwrap.wrap(story, 96):
            self.say(f"  {line}")
        self.say()

    def bot(self, text: str) -> None:
        for i, line in enumerate(text.splitlines() or [""]):
            self.say(("benchbot  " if i == 0 else "          ") + line)


class Demo:
    """The story, step by step, with every resource it starts tracked for cleanup."""

    def __init__(self, out_dir: Path, fast: bool, emit: Callable[[str], None] = print) -> None:
        self.out_dir = out_dir
        #: the engines' logs, kept with the outputs: the transcript names them (``spawn: ... (log PATH)``)
        self.logs = (out_dir / "logs").resolve()
        self.fast = fast
        self.t = Transcript(emit)
        self.work = Path(tempfile.mkdtemp(prefix="benchbot-demo-"))
        self.port = free_local_port()
        self.vllm_port = free_local_port()
        self.workers: list[subprocess.Popen[bytes]] = []
        self.rogue: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.r: redis.Redis | None = None
        self.dispatcher: Dispatcher | None = None
        self.job_results: dict[str, tuple[int, list[EventRecord]]] = {}
        self.expected: dict[str, int] = {}  # job id -> the exit code the story expects
        self.surprises: list[str] = []

    # ------------------------------------------------------------------ set-up and tear-down

    def start(self) -> None:
        (self.out_dir / "plots").mkdir(parents=True, exist_ok=True)
        config_path = self.work / "benchbot.toml"
        config_path.write_text(demo_config(self.port, self.logs, self.vllm_port))
        sock = redis_conn.start_redis_server(self.work / "redis")
        self.env = {
            **os.environ,
            "REDIS_URL": f"unix://{sock}",
            "BENCHBOT_CONFIG": str(config_path),
            "BENCHBOT_STATE_DIR": str(self.work / "state"),
            "BENCHBOT_SIM_STARTUP_S": "0.5" if self.fast else "1.5",
            "BENCHBOT_SIM_STATE_DIR": str(self.work / "sim"),
        }
        os.environ.update(
            {
                k: self.env[k]
                for k in (
                    "REDIS_URL",
                    "BENCHBOT_CONFIG",
                    "BENCHBOT_STATE_DIR",
                    "BENCHBOT_SIM_STARTUP_S",
                    "BENCHBOT_SIM_STATE_DIR",
                )
            }
        )
        self.r = redis_conn.connect(self.env["REDIS_URL"])
        config = load_config(str(config_path))
        self.dispatcher = Dispatcher(config, self.r, plots_dir=self.out_dir / "plots")
        for index, host in ((1, "gpu-1"), (2, "gpu-1"), (3, "vllm-1")):
            with open(self.work / f"worker{index}.log", "wb") as log:
                self.workers.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "bot.cli",
                            "worker",
                            "--host",
                            host,
                            "--name",
                            f"demo-worker-{index}",
                        ],
                        env=self.env,
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + 30
        while not (self.r.exists(keys.observer_alive("gpu-1")) and self.r.exists(keys.observer_alive("vllm-1"))):
            if time.monotonic() > deadline:
                raise RuntimeError("the demo workers did not start; see " + str(self.work))
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.workers:
            for child in _children(proc.pid):  # RQ runs each job in its own process group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child, signal.SIGKILL)
        for proc in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        self._kill_port_owner()
        self._kill_port_owner(self.vllm_port)
        if self.rogue is not None and self.rogue.poll() is None:
            self.rogue.kill()
            self.rogue.wait(timeout=5)
        redis_conn.stop_redis_server(self.work / "redis")
        shutil.rmtree(self.work, ignore_errors=True)

    def _kill_port_owner(self, port: int | None = None) -> None:
        """Whatever still listens on the demo port (a server the story left) goes with the demo."""
        import asyncio

        async def kill() -> None:
            transport = LocalTransport()
            pid = await transport.listener_pid(port or self.port)
            if pid:
                info = await transport.process_info(pid)
                if info and info.pgid == pid:
                    os.killpg(pid, signal.SIGKILL)  # the demo's own box, the demo's own server
                else:
                    os.kill(pid, signal.SIGKILL)
            await transport.close()

        with contextlib.suppress(Exception):
            asyncio.run(kill())

    # ------------------------------------------------------------------ talking to benchbot

    def command(self, user: str, line: str, *, wait: bool = True, expect: int = 0) -> str | None:
        assert self.dispatcher is not None and self.r is not None
        self.t.say(f"@{user:<6}  {line}")
        return self._answered(line, self.dispatcher.handle(user, CHANNEL, line), wait=wait, expect=expect)

    def queue_quietly(self, user: str, line: str) -> tuple[str, str, Reply]:
        """Send a command now and show it later (:meth:`shown_late`), in the chapter that tells its story."""
        assert self.dispatcher is not None
        return user, line, self.dispatcher.handle(user, CHANNEL, line)

    def shown_late(self, user: str, line: str, reply: Reply) -> str | None:
        """A command :meth:`queue_quietly` sent: the line, its answer and its job's events, as :meth:`command`."""
        self.t.say(f"@{user:<6}  {line}")
        return self._answered(line, reply, wait=True, expect=0)

    def talk(self, user: str, thread: tuple[str, str], text: str) -> str | None:
        """``@benchbot TEXT`` in a job's thread, answered as Slack's events are (:mod:`bot.thread_talk`)."""
        assert self.dispatcher is not None and self.r is not None
        job_id, ts = thread
        self.t.say(f"@{user:<6}  (in the thread of #{job_id}) @benchbot {text}")
        reply = thread_talk.ThreadTalk(self.dispatcher).answer(user, CHANNEL, ts, text)
        if reply.job_id:  # its story goes into the same thread, as the Slack front end records it
            thread_talk.remember(self.r, CHANNEL, ts, reply.job_id)
        return self._answered(text, reply, wait=True, expect=0)

    def note(self, user: str, thread: tuple[str, str], text: str) -> None:
        """A plain reply in a job's thread: kept with the thread's run as a note."""
        assert self.dispatcher is not None and self.r is not None
        self.t.say(f"@{user:<6}  (in the thread of #{thread[0]}) {text}")
        context = thread_talk.thread_context(self.r, CHANNEL, thread[1])
        if context is None:
            self.surprises.append(f"the thread of #{thread[0]} is not known")
            return
        notes.add_note(self.r, thread_talk.ThreadTalk(self.dispatcher).run_of(context), user, text)

    def _answered(self, line: str, reply: Reply, *, wait: bool, expect: int) -> str | None:
        self.t.bot(reply.text)
        if not reply.ok:
            self.surprises.append(f"{line!r} was refused: {reply.text}")
        if reply.job_id:
            self.expected[reply.job_id] = expect
        for path in reply.files:
            self.t.bot(f"  [image] {self._rel(path)}")
        if reply.job_id and wait:
            self.wait(reply.job_id)
        return reply.job_id

    def wait(self, job_id: str) -> int:
        assert self.r is not None
        lines: list[str] = []
        followed = follow_job(
            self.r, job_id, as_json=False, out_dir=self.out_dir / "plots", timeout_s=300, emit=lines.append
        )
        code, seen = followed.code, followed.events
        for chunk in lines:
            for line in chunk.splitlines():
                if line.startswith("  ") and line.strip().startswith(str(self.out_dir)):
                    line = "  " + self._rel(line.strip())
                self.t.say(f"   | {line}")
        self.job_results[job_id] = (code, seen)
        if code != self.expected.get(job_id, 0):
            ended = seen[-1]["type"] if seen else "no terminal event"
            data = seen[-1].get("data") or {} if seen else {}
            why = data.get("message") or data.get("error") or data.get("kind") or ""
            self.surprises.append(
                f"job {job_id} ended {ended}, which the story did not expect" + (f": {why}" if why else "")
            )
        return code

    def _rel(self, path: str) -> str:
        with contextlib.suppress(ValueError):
            return str(Path(path).resolve().relative_to(Path.cwd()))
        return path

    def run_id_of(self, job_id: str) -> str | None:
        for event in self.job_results.get(job_id, (1, []))[1]:
            if event["type"] == events.SUCCEEDED:
                outcome = parse_outcome(event["data"])
                return outcome.run_id or None if isinstance(outcome, (BenchOutcome, LaunchOutcome)) else None
        return None

    # ------------------------------------------------------------------ the story

    def bench_words(self) -> str:
        return self.small_bench() if self.fast else "1,8,32 in=512 out=64"

    def small_bench(self) -> str:
        return "1,8 in=256 out=32 n=16"

    def tune_words(self) -> str:
        """A tune small enough for a chapter: two configs, two trials, one finalist. The limits are loose
        (the story is the search and its gate, not the SLO) so a loaded box's p99 cannot fail every level;
        ``eval n=60`` is what flags the cutlass FP4 GEMM's few wrong answers (the sweep's n)."""
        return (
            "/tune moe=cutlass fp4=cudnn,cutlass slo ttft=3s itl=250ms budget=2 in=32 out=8 n=4 warmup=0 max=2 "
            f"eval n={EVAL_N}"
        )

    def play(self) -> None:
        t = self.t
        t.say(
            "benchbot demo: the seed's session, replayed on a simulated 8 x RTX PRO 6000 Blackwell host (SM120, PCIe)."
        )
        t.say(
            f"Two workers serve host gpu-1 (engine port {self.port}), one serves vllm-1 (vLLM, port {self.vllm_port}); "
            "everyone talks to the same dispatcher Slack uses."
        )
        bench = self.bench_words()

        t.chapter(
            "1. The baseline",
            "alice launches the configuration that works on SM120, flashinfer_cutlass MoE with the "
            "flashinfer_cudnn FP4 GEMM, benchmarks it under the same lease, and checks it answers right "
            "(a short accuracy check, stored with the run: the host's answer sheet from now on).",
        )
        baseline_job = self.command("alice", f"/launch cutlass cudnn then bench {bench} then eval n={EVAL_N}")
        baseline_run = self.run_id_of(baseline_job or "")
        if baseline_run:
            self.command("alice", f"/runs tag {baseline_run} baseline")

        t.chapter(
            "2. NEXTN, with a teammate queued behind it",
            "alice tries NEXTN speculative decoding; bob asks for NEXTN with custom all-reduce at the "
            "same moment. No second server on the same port: bob's job waits its turn.",
        )
        nextn_job = self.command("alice", f"/launch nextn cudnn then bench {bench}", wait=False)
        bob_job = self.command("bob", f"/launch nextn cudnn customar then bench {bench}", wait=False)
        self.command("bob", "/queue")
        nextn_run = bob_run = None
        if nextn_job:
            self.wait(nextn_job)
            nextn_run = self.run_id_of(nextn_job)
        if bob_job:
            self.wait(bob_job)
            bob_run = self.run_id_of(bob_job)

        t.chapter(
            "3. flashinfer_trtllm dies on SM120",
            "carol tries the trtllm-gen MoE kernels. FlashInfer builds them for SM100 only; the launch dies and "
            "benchbot says why, with the log line that says so.",
        )
        self.command("carol", "/launch trtllm cudnn", expect=1)

        t.chapter(
            "4. flashinfer_cutedsl answers !!!!",
            "It loads and reports healthy, but the smoke generation is all '!' (NaN logits). benchbot "
            "refuses to call it ready and stops it, so nobody benchmarks garbage.",
        )
        self.command("carol", "/launch cutedsl cudnn", expect=1)

        t.chapter(
            "5. A server swapped behind the bot's back",
            "dave logs in over SSH, kills what runs and starts his own NEXTN server by hand on the same "
            "port. /status reports what really runs: unmanaged, with its real arguments.",
        )
        self.command("alice", "/launch cutlass cudnn")
        self.swap_behind_the_back()
        self.command("alice", "/status")

        t.chapter(
            "6. The seed's mistake, refused",
            "frank benchmarks whatever runs ('any'): the result is stamped with dave's NEXTN config, not "
            "a label anyone assumed. While it runs, alice queues her baseline launch and erin queues a "
            "bench of 'what is running now' (dave's NEXTN). By the time erin's turn comes, alice's "
            "launch has replaced it: measuring would put a baseline number under a NEXTN label, so "
            "erin's bench refuses.",
        )
        frank = self.command("frank", f"/bench {self.small_bench()} any", wait=False)
        relaunch = self.command("alice", "/launch cutlass cudnn", wait=False)
        erin = self.command("erin", f"/bench {self.small_bench()}", wait=False, expect=1)
        for job in (frank, relaunch, erin):
            if job:
                self.wait(job)

        t.chapter("7. Compare the good runs", "One table and one plot across the baseline and both NEXTN runs.")
        good = [r for r in (baseline_run, nextn_run, bob_run) if r]
        if len(good) >= 2:
            self.command("alice", "/compare " + " ".join(good))

        t.chapter(
            "8. The to-do list, automated",
            "A sweep launches and benches each configuration in turn under one lease; the trtllm cell "
            "fails with its diagnosis and the sweep goes on. 'eval' checks each config's answers too: the "
            "flashinfer_cutlass FP4 GEMM keeps pace with the others, but a few points of accuracy are gone, "
            "and it is flagged.",
        )
        self.command(
            "alice",
            f"/sweep cutlass cudnn, trtllm cudnn, nextn cudnn, cutlass fp4-cutlass bench {self.small_bench()} "
            f"eval n={EVAL_N}",
        )

        t.chapter("9. Done for the day", "alice stops the server; the GPUs are free.")
        self.command("alice", "/stop")
        self.command("alice", "/runs 20")
        # Chapter 12's /tune is queued now, so its trials run on gpu-1 while chapters 10 and 11 use vllm-1 and
        # the threads; its chapter says so, and shows it from its command on.
        tune = self.queue_quietly("alice", self.tune_words())

        t.chapter(
            "10. The same commands on vLLM",
            "The team's second box runs vLLM. alice launches the same setup in vLLM's words (flashinfer_cutlass "
            "MoE, flashinfer_cudnn FP4 linear, MTP) on vllm-1, benches it and checks its answers; /compare sets "
            "it beside the SGLang baseline and NEXTN runs, each run with its engine, version and fingerprint "
            "(the simulator times both engines with one model: the difference is the configs').",
        )
        vllm_job = self.command(
            "alice", f"/launch cutlass cudnn mtp on vllm-1 then bench {self.small_bench()} then eval n={EVAL_N}"
        )
        vllm_run = self.run_id_of(vllm_job or "")
        sglang_runs = [r for r in (baseline_run, nextn_run) if r]
        if vllm_run and sglang_runs:
            self.command("alice", "/compare " + " ".join([*sglang_runs, vllm_run]))
        self.command("alice", "/stop vllm-1")

        t.chapter(
            "11. Talking about a result in its thread",
            "Back in the thread of alice's NEXTN job (chapter 2), the team discusses the result where it landed. "
            "No run id, host or config is retyped: the thread's job is the context, and a plain reply stays "
            "with the run as a note.",
        )
        if nextn_job and nextn_run and self.r is not None:
            thread = (nextn_job, f"thread-of-{nextn_job}")
            thread_talk.remember(self.r, CHANNEL, thread[1], nextn_job)
            self.talk("bob", thread, "compare baseline")
            self.note("bob", thread, "NEXTN keeps its lead at 8 in flight")
            self.talk("alice", thread, "tag nextn-candidate")
            self.talk("alice", thread, "notes")

        t.chapter(
            "12. The search, done by benchbot",
            "Instead of writing the sweep by hand, alice had asked /tune for the best FP4 GEMM under a latency "
            "limit, right after her /stop (chapter 9): its trials ran on gpu-1 while the team used vllm-1. Each "
            "trial launches its config, searches the SLO's knee and checks its answers against the baseline's: "
            "the cutlass FP4 GEMM is as fast, but it gets questions wrong, so it can never win. The best of the "
            "rest is re-run with repeat=3 and the full eval, and the reply names the winner and the one /launch "
            "line that reproduces it.",
        )
        self.shown_late(*tune)

    def swap_behind_the_back(self) -> None:
        """Kill the managed server and start an unmanaged NEXTN one on the same port, as a person would."""
        self._kill_port_owner()
        assert self.dispatcher is not None
        argv = [
            sys.executable,
            "-m",
            "workers.sim.sglang",
            "--model-path",
            self.dispatcher.config.host("gpu-1").engine.model,
            "--tp",
            "8",
            "--port",
            str(self.port),
            "--quantization",
            "modelopt_fp4",
            "--moe-runner-backend",
            "flashinfer_cutlass",
            "--fp4-gemm-backend",
            "flashinfer_cudnn",
            "--speculative-algorithm",
            "NEXTN",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
            "--mamba-scheduler-strategy",
            "extra_buffer",
        ]
        self.t.say(
            f"$ dave@gpu-1: kill <server>; nohup python -m sglang.launch_server ... --speculative-algorithm "
            f"NEXTN --port {self.port} &"
        )
        # dave's server runs on gpu-1's (simulated) GPUs like any other: the nvidia-smi stand-in of gpu-1 must
        # see its memory and load, so it registers in gpu-1's sim state dir, as benchbot's launches there do.
        gpu_state = simulated.host_state_dir(self.dispatcher.config.host("gpu-1"), self.env)
        self.rogue = subprocess.Popen(
            argv,
            env={**self.env, "SGLANG_ENABLE_SPEC_V2": "1", simulated.STATE_ENV: gpu_state},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        import httpx

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError("dave's server did not come up")

    def write_outputs(self) -> None:
        assert self.r is not None
        (self.out_dir / "transcript.txt").write_text("\n".join(self.t.lines) + "\n")
        with open(self.out_dir / "results.jsonl", "w", encoding="utf-8") as stream:
            export.export_runs(self.r, "jsonl", stream)
        with open(self.out_dir / "results.csv", "w", encoding="utf-8", newline="") as stream:
            export.export_runs(self.r, "csv", stream)
        summary = {job: code for job, (code, _) in self.job_results.items()}
        (self.out_dir / "jobs.json").write_text(json.dumps(summary, indent=2))
        self.t.say()
        self.t.say(
            f"Outputs in {self.out_dir}/: transcript.txt, results.jsonl, results.csv, plots/*.png, "
            "logs/*.log (each engine's log, as the transcript names them)"
        )


def run_demo(out_dir: Path, fast: bool = False, emit: Callable[[str], None] = print) -> int:
    """Play the demo; 0 when the story ran to its end."""
    return play_demo(lambda: Demo(out_dir, fast, emit), out_dir, emit)


def play_demo(make: Callable[[], Demo], out_dir: Path, emit: Callable[[str], None] = print) -> int:
    """Start, play and stop the demo ``make`` builds, writing its outputs; 0 when the story ran to its end."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in [*(out_dir / "plots").glob("*.png"), *(out_dir / "logs").glob("*.log")]:
        old.unlink()
    demo = make()
    started = time.monotonic()
    try:
        demo.start()
        demo.play()
        demo.write_outputs()
    finally:
        demo.stop()
    emit(f"demo finished in {time.monotonic() - started:.0f} s; no process left running.")
    for surprise in demo.surprises:
        emit(f"UNEXPECTED: {surprise}")
    return 1 if demo.surprises else 0
