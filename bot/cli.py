"""``benchbot``: the entry point. It parses arguments and calls library functions, nothing more.

Exit codes of ``say``: 0 done, 2 the command was refused (bad input, access), 1 the job failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bot.follow import EXIT_OK, EXIT_REFUSED, EventRecord, follow_job
from workers.errors import BenchbotError

#: Lifecycle lines of the long-running commands (a worker's shutdown steps), shown at INFO whatever --verbose says.
log = logging.getLogger("benchbot.cli")
log.setLevel(logging.INFO)

if TYPE_CHECKING:
    from workers.config import Config


def _load(args: argparse.Namespace):
    """Load the config (exporting its path so worker processes find the same one) and connect Redis."""
    from workers import redis_conn
    from workers.config import find_config_path, load_config

    path = find_config_path(args.config)
    if path is not None:
        os.environ["BENCHBOT_CONFIG"] = str(path.resolve())
    return load_config(args.config), redis_conn.connect(decode_responses=True)


def plots_dir(out: str | None) -> Path:
    """Where front ends without Slack write PNGs: ``--out`` or the state dir's ``plots/``."""
    from workers.redis_conn import state_dir

    path = Path(out) if out else state_dir() / "plots"
    path.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------ say / console


def cmd_say(args: argparse.Namespace) -> int:
    """One command through the same dispatcher Slack uses."""
    from bot.dispatch import Dispatcher

    config, r = _load(args)
    out_dir = plots_dir(args.out)
    dispatcher = Dispatcher(config, r, plots_dir=out_dir)
    reply = dispatcher.handle(args.user, args.channel, args.text)
    if not reply.ok:
        if args.json:
            out = {**reply.to_dict(), "events": [], "plots": [], "runs": [], "exit_code": EXIT_REFUSED}
            print(json.dumps(out, indent=2))  # the same schema-1 shape as an accepted command
        else:
            print(reply.text, file=sys.stderr)
        return EXIT_REFUSED
    code, paths = EXIT_OK, list(reply.files)
    seen: list[EventRecord] = []
    runs: list[dict[str, object]] = []
    if not args.json:
        print(reply.text)
        if reply.files:
            print("plots:\n" + "\n".join(f"  {p}" for p in reply.files))
    if args.wait and reply.job_id:
        followed = follow_job(r, reply.job_id, as_json=args.json, out_dir=out_dir, timeout_s=args.timeout)
        code, seen, runs = followed.code, followed.events, [run.to_dict() for run in followed.runs]
        paths += followed.plots
    if args.json:
        out = {**reply.to_dict(), "events": seen, "plots": paths, "runs": runs, "exit_code": code}
        print(json.dumps(out, indent=2, default=str))
    return code


def cmd_console(args: argparse.Namespace) -> int:
    """The interactive front end."""
    from bot.console import run_console

    config, r = _load(args)
    return run_console(config, r, user=args.user, channel=args.channel, out_dir=plots_dir(args.out))


# ------------------------------------------------------------------ services


def cmd_worker(args: argparse.Namespace) -> int:
    """An RQ worker for one or more hosts, with its observer process."""
    from workers import redis_conn
    from workers.jobs.worker import run_worker
    from workers.observer import ObserverService
    from workers.ops_metrics import start_worker_metrics

    config, _ = _load(args)
    hosts = args.host or [config.default_host]
    for host in hosts:
        config.host(host)
    url = redis_conn.redis_url()
    metrics = start_worker_metrics(config, url, hosts)  # None unless [metrics] worker_ports names a host
    service = ObserverService(config, url, hosts).start()
    try:
        run_worker(url, hosts, name=args.name, burst=args.burst, lease_ttl_s=config.limits.lease_ttl_s)
    finally:
        log.info("worker stopped taking jobs; stopping its observer (pid %s)", service.pid)
        service.stop()
        if metrics is not None:
            metrics.stop()
        log.info("observer stopped; the worker exits")
    return EXIT_OK


def cmd_slack(args: argparse.Namespace) -> int:
    """The Slack app (Socket Mode with SLACK_APP_TOKEN, else HTTP on --port) and its notifier."""
    from bot.slack_app import run_slack
    from workers import redis_conn

    config, _ = _load(args)
    run_slack(config, redis_conn.redis_url(), port=args.port)
    return EXIT_OK


#: ``benchbot sim`` for what is not an engine: the ``nvidia-smi`` stand-in.
SIM_TOOLS = {"nvidia-smi": "workers.sim.nvidia_smi"}


def cmd_sim(args: argparse.Namespace) -> int:
    """The simulated host: ``sim KIND [the engine's words]`` (each registered engine's simulator,
    ``workers.sim.KIND``: ``sim vllm serve MODEL [flags]``) or ``sim nvidia-smi``."""
    import importlib

    module = SIM_TOOLS.get(args.what) or f"workers.sim.{args.what}"
    try:
        sim_main = importlib.import_module(module).main
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        raise BenchbotError(f"there is no simulator of {args.what} ({module} is not installed)") from None
    return int(sim_main(args.rest) or 0)


def _sim_choices() -> list[str]:
    """``benchbot sim``'s first word: every registered engine, then the tools."""
    from workers.engines import registry

    return [*registry.kinds(), *SIM_TOOLS]


def cmd_bench(args: argparse.Namespace) -> int:
    """``bench URL LEVELS [opts]``: the load generator alone; table on stdout, files under --out."""
    from bot import standalone_bench
    from workers.config import load_config
    from workers.results.tables import format_levels_table

    config = load_config(args.config)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    progress = None if args.json else (lambda line: print(line, file=sys.stderr))
    record = standalone_bench.measure(
        args.url, args.words, config, api_key=api_key, model=args.model, on_progress=progress
    )
    files = standalone_bench.write_outputs(record, Path(args.out)) if args.out else []
    if args.json:
        print(json.dumps({**record.to_dict(), "files": [str(f) for f in files]}, indent=2, default=str))
    else:
        print(format_levels_table(record))  # the same per-level table /bench posts
        for path in files:
            print(f"  {path}")
    return EXIT_OK


def cmd_runs(args: argparse.Namespace) -> int:
    """``runs export --format jsonl|csv [--output FILE]``, ``runs show RUN`` (its row, levels and notes)."""
    from workers.results import export, notes

    _, r = _load(args)
    if args.action == "show":
        if not args.run:
            raise BenchbotError('name the run: "benchbot runs show r12"')
        print(notes.show_run(r, args.run))
        return EXIT_OK
    if args.output:
        with open(args.output, "w", encoding="utf-8", newline="") as stream:
            count = export.export_runs(r, args.format, stream)
        print(f"exported {count} runs to {args.output}", file=sys.stderr)
    else:
        export.export_runs(r, args.format, sys.stdout)
    return EXIT_OK


def cmd_redis(args: argparse.Namespace) -> int:
    """``redis url|start|stop``: the embedded server shared by every benchbot process here."""
    from workers import redis_conn

    if args.action == "stop":
        print("stopped" if redis_conn.stop_embedded_redis() else "not running")
    else:
        print(redis_conn.redis_url())
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    """``config check [--connect]``: load, validate and summarise the configuration (and reach each host)."""
    from workers.config import load_config
    from workers.engines import registry
    from workers.host.simulated import is_simulated

    config = load_config(args.config)
    print(f"config: {config.source}")
    for host in config.hosts.values():
        where = host.ssh_target if host.transport == "ssh" else "this machine"
        kind = "simulated, " if is_simulated(host) else ""
        print(f"  host {host.name}: {kind}{host.transport} ({where}), engine port {host.port}, {host.gpus} GPUs")
        engine = host.engine
        own = "" if engine == config.default_engine else " (its own [hosts." + host.name + ".engine])"
        print(f"    engine{own}: {engine.kind} `{' '.join(engine.command)}`, model {engine.model}")
    print(f"  presets: {', '.join(config.presets)}")
    evals = config.eval
    files = ", ".join(f"{name} ({f.path})" for name, f in evals.files.items())
    print(f"  eval: default {evals.task} n={evals.n} api={evals.api}; tasks builtin" + (f", {files}" if files else ""))
    for preset_set in dict.fromkeys(host.engine.preset_set for host in config.hosts.values()):
        if preset_set != registry.DEFAULT_KIND:  # the default engine's are the presets above
            print(f"  {registry.display_name(preset_set)} presets: {', '.join(config.presets_for(preset_set))}")
    if not getattr(args, "connect", False):
        return EXIT_OK
    return _connect_hosts(config)


def _connect_hosts(config: Config) -> int:
    """Reach every host as its worker would; 1 when any host has a problem."""
    import asyncio

    from workers.host.preflight import check_host

    async def all_hosts() -> list:
        return await asyncio.gather(*(check_host(host) for host in config.hosts.values()))

    failed = 0
    print("connect:")
    for check in asyncio.run(all_hosts()):
        state = "ok" if check.ok else "FAILED"
        print(f"  host {check.host}: {state}{' (simulated)' if check.simulated else ''}")
        for line in check.found:
            print(f"    {line}")
        for line in check.problems:
            print(f"    problem: {line}")
        failed += not check.ok
    print(f"{len(config.hosts) - failed} of {len(config.hosts)} hosts ready" + (f", {failed} failed" if failed else ""))
    return 1 if failed else EXIT_OK


def cmd_deploy(args: argparse.Namespace) -> int:
    """``deploy render --out DIR``: systemd units, compose file, Dockerfile, .env example from the config."""
    from ops.deploy import write_deploy_files
    from workers.config import load_config

    paths = write_deploy_files(
        load_config(args.config),
        Path(args.out),
        install_dir=args.install_dir,
        user=args.user,
        env_file=args.env_file,
        image=args.image,
    )
    for path in paths:
        print(path)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    """The seed's story, replayed against a simulated host."""
    if args.real:
        from bot.demo_real import run_real_demo

        return run_real_demo(out_dir=Path(args.out or "demo-output-real"))
    from bot.demo import run_demo

    return run_demo(out_dir=Path(args.out or "demo-output"), fast=args.fast)


# ------------------------------------------------------------------ argument parsing


def build_parser() -> argparse.ArgumentParser:
    """All subcommands and their help."""
    parser = argparse.ArgumentParser(
        prog="benchbot",
        description="Share a GPU box for LLM-serving experiments: queue launches and benchmarks per host, "
        "verify what really runs, report results.",
    )
    parser.add_argument(
        "--config", help="benchbot.toml (default: $BENCHBOT_CONFIG, ./benchbot.toml, else the embedded simulated host)"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    say = sub.add_parser(
        "say",
        help="run one command as a user, like Slack would",
        description="Send one command through the dispatcher Slack uses. Exit codes: 0 done, "
        "2 refused (bad input or access), 1 the job failed.",
    )
    say.add_argument("--as", dest="user", default=os.environ.get("USER", "me"), help="who is asking")
    say.add_argument("--channel", default="console", help="the channel it is said in")
    say.add_argument("--wait", action="store_true", help="follow the job's events until it ends")
    say.add_argument("--json", action="store_true", help="print one JSON object (schema 1) instead of text")
    say.add_argument("--out", help="directory for plots (default: the state dir's plots/)")
    say.add_argument("--timeout", type=float, default=None, help="stop following after this many seconds")
    say.add_argument("text", help='the command, e.g. "/launch nextn cudnn"')
    say.set_defaults(func=cmd_say)

    console = sub.add_parser(
        "console",
        help="interactive front end in the terminal",
        description="Type commands as in Slack (/launch, /bench, /status, ...); quit or Ctrl-D ends it.",
    )
    console.add_argument("--as", dest="user", default=os.environ.get("USER", "me"), help="who is asking")
    console.add_argument("--channel", default="console", help="the channel it is said in")
    console.add_argument("--out", help="directory for plots (default: the state dir's plots/)")
    console.set_defaults(func=cmd_console)

    worker = sub.add_parser(
        "worker",
        help="run jobs for a host (several workers may serve one host)",
        description="Serve the queues of the given hosts (default: the config's default_host) and observe "
        "them for /status. Ctrl-C stops it once the running job has ended.",
    )
    worker.add_argument("--host", action="append", help="host name from the config (repeatable)")
    worker.add_argument("--name", help="worker name (default: unique)")
    worker.add_argument("--burst", action="store_true", help="exit when the queue is empty")
    worker.set_defaults(func=cmd_worker)

    slack = sub.add_parser(
        "slack",
        help="the Slack app: Socket Mode if SLACK_APP_TOKEN is set, else HTTP",
        description="The Slack app and its notifier. Needs SLACK_BOT_TOKEN, and SLACK_APP_TOKEN (Socket Mode) "
        "or SLACK_SIGNING_SECRET (HTTP mode); see the README's Slack section.",
    )
    slack.add_argument("--port", type=int, default=3000, help="HTTP port for /slack/events (HTTP mode)")
    slack.set_defaults(func=cmd_slack)

    sim = sub.add_parser(
        "sim",
        help="the simulated GPU host: sim KIND [that engine's launch words, as its real command takes them] | "
        "sim nvidia-smi",
    )
    sim.add_argument("what", choices=_sim_choices(), help="an engine kind or the nvidia-smi stand-in")
    sim.add_argument("rest", nargs=argparse.REMAINDER, help="flags passed through")
    sim.set_defaults(func=cmd_sim)

    bench = sub.add_parser(
        "bench",
        help="the load generator alone against any SGLang or OpenAI-compatible server (no Redis, no worker)",
        description="Benchmark URL with /bench's grammar, e.g. 'benchbot bench http://127.0.0.1:30000 1,8,32 "
        "in=512 out=128' or '... rate=2,4,8 api=chat'. Prints the table; --out writes bench.json, "
        "bench.csv and PNG plots.",
    )
    bench.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:30000")
    bench.add_argument("words", nargs="+", help="levels (1,8,32) or rate=R,R, then options as in /bench")
    bench.add_argument("--out", help="directory for bench.json, bench.csv and the plots")
    bench.add_argument("--json", action="store_true", help="print the result as one JSON object")
    bench.add_argument("--model", help="model name for the OpenAI APIs (default: the server's first)")
    bench.add_argument(
        "--api-key-env", metavar="VAR", help="name of the environment variable holding the server's API key"
    )
    bench.set_defaults(func=cmd_bench)

    runs = sub.add_parser("runs", help="run history: runs export --format jsonl|csv, runs show RUN")
    runs.add_argument("action", choices=["export", "show"], help="export: every stored run; show: one, with notes")
    runs.add_argument("run", nargs="?", help="show: the run id (r12)")
    runs.add_argument("--format", choices=["jsonl", "csv"], default="jsonl", help="output format (default jsonl)")
    runs.add_argument("--output", help="file to write (default: stdout)")
    runs.set_defaults(func=cmd_runs)

    red = sub.add_parser(
        "redis",
        help="the embedded Redis: url | start | stop",
        description="The Redis benchbot uses when REDIS_URL is unset: a private server under the state dir.",
    )
    red.add_argument(
        "action", choices=["url", "start", "stop"], help="url: print it (starting it if needed); start; stop"
    )
    red.set_defaults(func=cmd_redis)

    cfg = sub.add_parser(
        "config",
        help="config check [--connect]: validate and summarise the configuration",
        description="Validate the config and list its hosts; --connect also reaches each host and runs its "
        "engine's version command.",
    )
    cfg.add_argument("action", choices=["check"], help="check: validate and summarise")
    cfg.add_argument(
        "--connect",
        action="store_true",
        help="also reach every host (SSH key files, host key, login), run its engine's version command and "
        "its nvidia-smi; exit 1 when any host fails",
    )
    cfg.set_defaults(func=cmd_config)

    deploy = sub.add_parser("deploy", help="deploy render --out DIR: systemd units and compose from the config")
    deploy.add_argument("action", choices=["render"], help="render: write the files for this config")
    deploy.add_argument("--out", required=True, help="directory to write the files into")
    deploy.add_argument("--install-dir", default="/opt/benchbot", help="where benchbot is installed (systemd)")
    deploy.add_argument("--user", default="benchbot", help="the service user (systemd)")
    deploy.add_argument("--env-file", default="/etc/benchbot/benchbot.env", help="EnvironmentFile (systemd)")
    deploy.add_argument("--image", default="benchbot:latest", help="container image (compose)")
    deploy.set_defaults(func=cmd_deploy)

    demo = sub.add_parser("demo", help="replay the seed's session against a simulated host")
    demo.add_argument("--out", help="output directory (default ./demo-output)")
    demo.add_argument("--fast", action="store_true", help="shorter benchmarks (for tests)")
    demo.add_argument(
        "--real",
        action="store_true",
        help="drive a real engine: vLLM's CPU build from .venv-real (BENCHBOT_REAL_VENV), a tiny model made now",
    )
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``benchbot``; user errors print a friendly message, never a traceback."""
    try:
        args = build_parser().parse_args(argv)  # the parser lists the engines: a bad BENCHBOT_ENGINES stops it
    except BenchbotError as exc:
        print(f"benchbot: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except BenchbotError as exc:
        print(f"benchbot: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
