"""Engine flags a command may give, by what the option does: matched after prefix resolution.

argparse accepts any unique prefix of an option (``--por`` is ``--port``, ``--hos`` is ``--host``,
``--model-pat`` is ``--model-path``), so comparing the typed spelling with a list of names lets every
flag through under another spelling. Here a flag is resolved as the engine's own parser would resolve
it, in the recorded contracts (``workers/engines/contracts``), and the *option it becomes* is judged by
the allow-list in :mod:`workers.engines.option_policy` (``option_policy.toml``):

* **member** options (backends, parallel sizes, cache, memory and scheduling knobs, speculative
  settings without a model) anyone on the access list may give; a JSON-valued one only with the keys a
  member may set (``--speculative-config '{"model": ...}'`` is an admin's);
* **admin-only** options name a path, a module, a class, a URL or address, or another model, or change
  what the engine trusts: an admin may give them (or put them in benchbot.toml), nobody else; so is
  any option the policy has not classified (a newer release's);
* **reserved** options are never taken from a command: benchbot sets them from the host config, or
  they would move where the server listens, what it trusts or where its data goes.

The bot does not know the host's engine version when it queues a job, so it judges a flag by the
strictest verdict over every recorded version of the host's engine (:func:`check_raw_flag`); the
worker, which knows the version, checks again against that version's contract before spawning
(:func:`raw_flag_problems`). A flag no recorded version knows is left to the engine's own check (the
worker refuses it as unknown, naming the nearest real option), except that a name the policy lists is
still judged by its own spelling.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from workers.engines.args import FlagValue
from workers.engines.contract import Contract, all_contracts
from workers.engines.option_policy import Level, Verdict, engines, policy
from workers.engines.registry import DEFAULT_KIND, display_name
from workers.errors import BenchbotError


def _names(level: Level) -> frozenset[str]:
    return frozenset(d for e in engines() for d, v in policy(e).levels.items() if v.level is level)


#: Options (argparse dests, any engine) a command may never set.
RESERVED_ARGS: frozenset[str] = _names(Level.RESERVED)

#: Options (argparse dests, any engine) only an admin may set.
ADMIN_ONLY_ARGS: frozenset[str] = _names(Level.ADMIN)

_ORDER = {Level.MEMBER: 0, Level.ADMIN: 1, Level.RESERVED: 2}


def _fallback_arg(flag: str) -> str:
    """The arg a flag names when no contract knows it: ``--trust-remote-code`` -> ``trust_remote_code``."""
    return flag.split("=", 1)[0].lstrip("-").split(".", 1)[0].replace("-", "_")


def _dotted_key(flag: str) -> str | None:
    """vLLM's ``--speculative-config.model`` sets the key ``model``; None for a plain flag."""
    head = flag.split("=", 1)[0]
    return head.split(".", 1)[1].split(".", 1)[0] if "." in head else None


def _judged(flag: str, value: FlagValue, contracts: Sequence[Contract]) -> list[tuple[Verdict, str, Contract | None]]:
    """(verdict, option string, contract) for each contract that accepts ``flag``; when none does, the
    flag's own name judged by every engine's policy (a flag no recorded version knows). An alias is judged
    as the option it is (``-cc`` as ``--compilation-config``), with a value given attached (``-cc={...}``,
    ``--x={...}``) judged as if given apart."""
    key = _dotted_key(flag)
    if value is True and "=" in flag:
        value = flag.split("=", 1)[1]
    found: list[tuple[Verdict, str, Contract | None]] = []
    for contract in contracts:
        res = contract.resolve(flag)
        if res.option is None or res.flag is None:
            continue
        rules = policy(contract.engine)
        names = {res.option.dest, contract.server_arg(flag) or res.option.dest}
        verdicts = [rules.judge(name, value, key) for name in names if rules.classified(name)]
        if not verdicts:
            verdicts = [rules.judge(res.option.dest, value, key)]  # unclassified: admin-only
        long_form = res.flag  # a short alias is named by its long form: -cc is --compilation-config
        if not long_form.startswith("--"):
            long_form = next((f for f in res.option.flags if f.startswith("--")), long_form)
        found.append((max(verdicts, key=lambda v: _ORDER[v.level]), long_form, contract))
    if not found:
        name = flag.split("=", 1)[0]
        arg = _fallback_arg(name)
        for engine in engines():
            rules = policy(engine)
            if rules.classified(arg):
                found.append((rules.judge(arg, value, key), name, None))
    return found


def _as(flag: str, option: str, contract: Contract | None) -> str:
    """``--por (--port in SGLang 0.5.9)``, or just ``--port`` when it was spelled out."""
    if option == flag.split("=", 1)[0] or contract is None:
        return flag
    return f"{flag} ({option} in {contract.label()})"


def _sentence(flag: str, option: str, contract: Contract | None, verdict: Verdict) -> str:
    """One refusal, naming the option as typed and as the engine reads it, and why."""
    who = _as(flag, option, contract)
    if verdict.level is Level.RESERVED:
        return (
            f"{who} is set by benchbot from the host config and cannot be given on the command line (it {verdict.why})"
        )
    if verdict.detail:
        who = f"{who} with {verdict.detail}"
    if verdict.reason != "unlisted":
        why = verdict.why
    elif verdict.detail:
        why = f"is more than a member may set (a member may give {verdict.allowed})"
    else:
        why = f"is not on the list of {contract.label() if contract else 'engine'} options a member may set"
    return f"{who} {why}: only an admin may give it (or set it in benchbot.toml)"


def raw_flag_problem(flag: str, value: FlagValue, contracts: Sequence[Contract], *, admin: bool) -> str | None:
    """Why a command may not give ``flag`` with ``value`` (True: bare), or None when it may."""
    judged = _judged(flag, value, contracts)
    for verdict, option, contract in judged:
        if verdict.level is Level.RESERVED:
            return _sentence(flag, option, contract, verdict)
    if not admin:
        for verdict, option, contract in judged:
            if verdict.level is Level.ADMIN:
                return _sentence(flag, option, contract, verdict)
    return None


def reserved_flag_problem(flag: str, contracts: Sequence[Contract], *, admin: bool) -> str | None:
    """Why a command may not give ``flag`` at all (its value aside), or None when it may."""
    return raw_flag_problem(flag, True, contracts, admin=admin)


def check_reserved_flag(flag: str) -> None:
    """Refuse a flag that is reserved in any recorded version of the default engine (the grammar knows no host
    yet; the worker judges the host's own engine again)."""
    problem = reserved_flag_problem(flag, all_contracts(DEFAULT_KIND), admin=True)
    if problem:
        raise BenchbotError(problem)


def check_raw_flag(flag: str, value: FlagValue = True, *, admin: bool = False, engine: str = DEFAULT_KIND) -> None:
    """Refuse a reserved flag always, and an admin-only one (or value) for everyone but admins, judged
    in every recorded version of ``engine`` (the host's engine; the bot does not know its version)."""
    problem = raw_flag_problem(flag, value, all_contracts(engine), admin=admin)
    if problem:
        raise BenchbotError(problem)


def raw_flag_problems(
    flags: Iterable[tuple[str, FlagValue]], contracts: Contract | Sequence[Contract], *, admin: bool
) -> list[str]:
    """The worker's check at launch, against the host's own engine version (or, when the host's version
    has no contract, every recorded one of its engine)."""
    chosen = [contracts] if isinstance(contracts, Contract) else list(contracts)
    return [p for flag, value in flags if (p := raw_flag_problem(flag, value, chosen, admin=admin)) is not None]


def unrecorded_version_problems(flags: Sequence[tuple[str, FlagValue]], engine: str, *, admin: bool) -> list[str]:
    """The worker's check when the host's version has no contract (none recorded, none dumped): each flag
    judged in every recorded version of ``engine``; for a member, a flag none of them knows is refused
    too, since it may be a newer release's option nobody has classified (the allow-list fails closed)."""
    contracts = all_contracts(engine)
    problems = raw_flag_problems(flags, contracts, admin=admin)
    if not admin:
        name = display_name(engine)
        problems += [
            f"{flag} is not an option of any {name} version benchbot has recorded, and this host's version has "
            "no recorded contract: only an admin may give it"
            for flag, _ in flags
            if not any(c.resolve(flag).ok for c in contracts)
        ]
    return problems


def reserved_flag_problems(flags: Iterable[str], contract: Contract, *, admin: bool) -> list[str]:
    """:func:`raw_flag_problems` for flags given without their values."""
    return raw_flag_problems(((flag, True) for flag in flags), contract, admin=admin)
