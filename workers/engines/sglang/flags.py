"""SGLang flags and server args: flag <-> arg names via the recorded contracts, requested args, what ``sglang
serve`` hands on, the secret flags, and what SGLang renamed or rewrites (for the requested-vs-observed diff).

Pure functions over names and values (no I/O). Facts come from the contracts recorded from the real wheels
(``workers/engines/contracts/``) and docs/observe.md ("Requested vs observed"); docs/sim.md ("Versions and
flags") says what each version accepts.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from workers import secrets
from workers.engines import args
from workers.engines.args import ArgComparison, ArgValues, coerce_value
from workers.engines.contract import Contract, all_contracts, contract_or_newest
from workers.engines.sglang.processes import sglang_serve_args
from workers.json_value import JsonObject
from workers.secrets import is_secret_name

#: Args that newer SGLang versions store under another name; the diff looks there when the old name
#: is missing from the observed args (docs/observe.md, "Requested vs observed"; docs/sim.md, "Versions and flags").
OBSERVED_RENAMES: dict[str, tuple[str, ...]] = {
    "mamba_scheduler_strategy": ("mamba_radix_cache_strategy",),
    "mamba_radix_cache_strategy": ("mamba_scheduler_strategy",),
    "cuda_graph_max_bs": ("cuda_graph_max_bs_decode",),
    "stream_output": ("incremental_streaming_output",),
}


def _dashed(flag: str) -> str:
    return "--" + flag.strip().split("=", 1)[0].lstrip("-")


@functools.lru_cache(maxsize=4096)
def _recorded_arg(dashed: str) -> str | None:
    """What the newest recorded SGLang that accepts ``dashed`` (exactly or as a unique prefix) stores it as."""
    for contract in reversed(all_contracts("sglang")):
        if contract.resolve(dashed).ok:
            return contract.server_arg(dashed)
    return None


def contract_for(version: str | None) -> Contract | None:
    """The recorded contract of ``version``, else the newest recorded one (None when none is recorded)."""
    return contract_or_newest("sglang", version)


def flag_to_arg(flag: str, contract: Contract | None = None) -> str:
    """Map an SGLang CLI flag (``--tp``, ``--fp4-gemm-backend``) to the key ``/server_info`` reports it under.

    The recorded contracts answer, as SGLang's own parser would: ``contract`` (the host's version) when
    given, else the newest recorded version that accepts the flag. Only a flag no recorded version
    accepts (unknown, or an ambiguous prefix SGLang rejects) falls back to dashes -> underscores.
    ``--foo=bar`` is accepted (the value is ignored); a bare ``foo_bar`` is returned unchanged so the
    function is idempotent on already-mapped names.
    """
    name = flag.strip().split("=", 1)[0]
    if not name.startswith("-"):
        return name.replace("-", "_")
    dashed = _dashed(name)
    if contract is not None:
        found = contract.server_arg(dashed)
        if found is not None:
            return found
    return _recorded_arg(dashed) or dashed[2:].replace("-", "_")


def requested_args(flags: Mapping[str, str | bool | list[str]], contract: Contract | None = None) -> JsonObject:
    """Flags as given by a person or a preset (``{"--tp": "8", "--enable-metrics": True}``) -> server args.

    ``True`` marks a store_true flag that is present; ``False`` one that is explicitly absent (the
    server should report ``False``). Later flags win, like argparse. ``contract`` is the host's SGLang
    version when known (see :func:`flag_to_arg`).
    """
    out: JsonObject = {}
    for flag, value in flags.items():
        out[flag_to_arg(flag, contract)] = value if isinstance(value, bool) else coerce_value(value)
    return out


def server_argv(argv: Iterable[str]) -> list[str]:
    """The words of a process's argv that SGLang's ServerArgs parses, as ``sglang serve`` hands them on.

    ``python -m sglang.launch_server ...`` passes its argv as is. ``sglang serve`` (``sglang.cli.serve``)
    first takes out ``--model-type X`` (its backend choice, not a server arg) and reads a first plain word
    as the model (``sglang serve org/model --tp 8`` is ``--model-path org/model --tp 8``); without this a
    served model given that way would read as no model at all.
    """
    items = list(argv)
    rest = sglang_serve_args(items)
    if rest is None:
        return items
    kept: list[str] = []
    i = 0
    while i < len(rest):
        if rest[i] == "--model-type":
            i += 2
            continue
        if not rest[i].startswith("--model-type="):
            kept.append(rest[i])
        i += 1
    if kept and not kept[0].startswith("-"):
        kept = ["--model-path", kept[0], *kept[1:]]
    return kept


def is_secret_flag(flag: str) -> bool:
    """Does this flag (``--api-key``, or an abbreviation SGLang accepts like ``--api-k``) carry a secret?"""
    return is_secret_name(flag_to_arg(flag))


def redact_argv(argv: Iterable[str]) -> list[str]:
    """argv with the value after a secret flag (``--api-key K``, ``--api-k=K``) replaced: the secret policy
    (:func:`workers.secrets.redact_argv`) with SGLang's flag abbreviations resolved."""
    return secrets.redact_argv(argv, is_secret_flag=is_secret_flag)


# ---------------------------------------------------------------------------------------------------------
# Requested vs observed
# ---------------------------------------------------------------------------------------------------------

#: Values SGLang rewrites on purpose; (arg, requested, observed) -> why they are the same thing.
EQUIVALENT_VALUES: dict[tuple[str, str, str], str] = {
    ("speculative_algorithm", "NEXTN", "EAGLE"): "SGLang renames NEXTN to EAGLE internally",
}


def compare_requested(requested: ArgValues, observed_args: ArgValues) -> ArgComparison:
    """What was asked for against what SGLang reports (:func:`workers.engines.args.compare_requested` with
    SGLang's renamed args and rewritten values)."""
    return args.compare_requested(requested, observed_args, renames=OBSERVED_RENAMES, equivalents=EQUIVALENT_VALUES)
