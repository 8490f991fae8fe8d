"""An engine's recorded contract: its real launch options, server_info keys, ready line and error texts.

Each ``contracts/<engine>-<version>.json`` was recorded from the engine's real wheel by
``tools/record_sglang_contract.py`` (or dumped from a host's installed engine by the worker). benchbot
holds its flag building, presets, parsing and diagnosis rules against these files instead of against
its own simulator, and the simulator takes its accepted flags from them, so the two can no longer share
a mistake.

Flag resolution follows argparse as SGLang uses it (``allow_abbrev`` on): an exact option string wins;
otherwise a flag that is the prefix of exactly one option string is that option, and a prefix of
several is *ambiguous*, which argparse rejects. ``--tp 8`` works only because ``--tp-size`` is the only
option starting with ``--tp``; ``--cuda-graph-max-bs`` became ambiguous in 0.5.23 when it was split
into ``-decode`` and ``-prefill``.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.engines.args import FlagValue
from workers.engines.registry import DEFAULT_KIND, display_name
from workers.engines.registry import ENGINE_NAMES as ENGINE_NAMES  # how messages name engines; re-exported
from workers.errors import BenchbotError

CONTRACTS_DIR = Path(__file__).resolve().parent / "contracts"
SCHEMA = 1


class UnknownVersion(BenchbotError):
    """No contract was recorded for this engine version."""


# --------------------------------------------------------------------------------------------- versions


_VERSION_PART = re.compile(r"^(\d+)")


def parse_version(text: str) -> tuple[int, ...]:
    """``"0.5.23"`` -> ``(0, 5, 23)``; trailing tags (``rc1``, ``.post1``, ``+cu129``) are ignored."""
    parts: list[int] = []
    for piece in str(text).strip().lstrip("vV").split("+")[0].split("."):
        m = _VERSION_PART.match(piece)
        if not m:
            break
        parts.append(int(m.group(1)))
        if m.group(1) != piece:
            break
    if not parts:
        raise ValueError(f"not a version: {text!r}")
    return tuple(parts)


_SPEC_RE = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*([0-9][0-9A-Za-z.+-]*)\s*$")


def check_version_spec(spec: str) -> str:
    """Validate ``">=0.5.15"``, ``"<0.5.15"``, ``">=0.5.10,<0.5.18"`` or a bare ``"0.5.23"``; returns it."""
    clauses = [c for c in spec.split(",")]
    if not clauses or any(not _SPEC_RE.match(c) for c in clauses):
        raise ValueError(f'{spec!r} is not a version range (use e.g. ">=0.5.15", "<0.5.15" or "0.5.23")')
    for clause in clauses:
        m = _SPEC_RE.match(clause)
        assert m is not None
        parse_version(m.group(2))
    return spec


def version_matches(spec: str, version: str) -> bool:
    """True when ``version`` lies in the range ``spec`` (clauses joined by commas all hold)."""
    have = parse_version(version)
    for clause in check_version_spec(spec).split(","):
        m = _SPEC_RE.match(clause)
        assert m is not None
        op, want = m.group(1) or "==", parse_version(m.group(2))
        width = max(len(have), len(want))
        a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
        ok = {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]
        if not ok:
            return False
    return True


# --------------------------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Option:
    """One launch option as the engine's own parser defines it."""

    flags: tuple[str, ...]
    dest: str
    action: str  # store | store_true | store_false | store_const | append | count | help | custom
    nargs: int | str | None = None
    choices: tuple[str, ...] | None = None
    default: Any = None
    type: str | None = None
    required: bool = False
    const: Any = None
    action_class: str | None = None
    help: str = ""
    hidden_flags: tuple[str, ...] = ()  # matched by the parser (prefixes too) but kept out of help
    negative_flags: tuple[str, ...] = ()  # vLLM's EnableDisableAction: these spellings store False

    @property
    def name(self) -> str:
        """The option's first (canonical) spelling."""
        return self.flags[0]

    @property
    def takes_value(self) -> bool:
        """False for flags that stand alone (``--enable-metrics``), True for ``--tp-size 8``."""
        if self.action in ("store_true", "store_false", "store_const", "append_const", "count", "help"):
            return False
        if self.action == "custom":
            if self.nargs is not None:
                return self.nargs != 0
            cls = self.action_class or ""
            return not any(word in cls for word in ("Const", "StoreTrue", "StoreFalse", "BooleanOptional"))
        return self.nargs != 0

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Option:
        choices = d.get("choices")
        return cls(
            flags=tuple(d["flags"]),
            dest=str(d["dest"]),
            action=str(d["action"]),
            nargs=d.get("nargs"),
            choices=tuple(str(c) for c in choices) if choices is not None else None,
            default=d.get("default"),
            type=d.get("type"),
            required=bool(d.get("required", False)),
            const=d.get("const"),
            action_class=d.get("action_class"),
            help=str(d.get("help") or ""),
            hidden_flags=tuple(d.get("hidden_flags") or ()),
            negative_flags=tuple(d.get("negative_flags") or ()),
        )


@dataclass(frozen=True)
class Resolution:
    """What a flag given on a command line means to the engine's parser."""

    given: str
    kind: str  # exact | prefix | ambiguous | unknown
    option: Option | None = None
    flag: str | None = None  # the option string it resolved to
    candidates: tuple[str, ...] = ()  # ambiguous: the option strings it could be
    nearest: tuple[str, ...] = ()  # unknown: the closest real option strings

    @property
    def ok(self) -> bool:
        """True when the parser accepts the flag (exactly or as a unique prefix)."""
        return self.option is not None


@dataclass(frozen=True)
class FlagProblem:
    """One flag the engine would refuse, with a sentence a person can act on."""

    flag: str
    message: str


class TextFieldMissing(KeyError):
    """``RecordedText.render`` was not given a value for one of the text's fields."""


@dataclass(frozen=True)
class TextField:
    """One field of a recorded f-string (or ``%`` logging call): the source expression that fills it,
    how the source formats it (``!r``, ``:.2f``, ``%d`` or ``""``) and the sample the recorder used."""

    expr: str
    format: str
    sample: str

    @property
    def short(self) -> str:
        """``self.server_args.mem_fraction_static`` -> ``mem_fraction_static``; other expressions as written."""
        return self.expr.rsplit(".", 1)[-1] if _DOTTED.match(self.expr) else self.expr

    def render(self, value: object) -> str:
        """``value`` formatted as the source formats this field."""
        if self.format.startswith("%"):
            return self.format % (value,)
        conversion, _, spec = self.format.partition(":")
        converters: dict[str, Callable[[object], object]] = {"!r": repr, "!s": str, "!a": ascii}
        converted = converters.get(conversion, _identity)(value)
        return format(converted, spec)


_DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")


def _identity(value: object) -> object:
    return value


@dataclass(frozen=True)
class RecordedText:
    """An exact text from the engine's wheels, where it came from, what it is and how it is emitted.

    ``text`` is None when the text exists but could not be read from any wheel; ``source`` then starts
    with ``not recorded:`` and says why (a CUDA device-side printf, a library the recorder lacked).
    Python literals also carry their ``template`` (``str.format`` syntax, ``{0}`` per field) and
    ``fields``, so the text can be rendered with other values in the engine's exact wording.
    """

    key: str
    text: str | None
    source: str
    line: int | None
    kind: str = ""
    emitted: str = ""  # "raise ValueError", "assert", "logger.warning", "argparse error", ...
    template: str | None = None
    fields: tuple[TextField, ...] = ()

    @property
    def recorded(self) -> bool:
        """True when the exact text was read from a wheel."""
        return self.text is not None

    def render(self, values: Mapping[str, object] | None = None) -> str:
        """The text with each field filled from ``values``, keyed by the field's source expression or by
        the last name of a dotted one (``mem_fraction_static`` for ``self.server_args.mem_fraction_static``).
        A text without a template (a C string, argparse's line) is returned as recorded."""
        if self.text is None:
            raise LookupError(f"text {self.key!r} was not recorded: {self.source}")
        if self.template is None:
            return self.text
        values = values or {}
        rendered = []
        for f in self.fields:
            if f.expr in values:
                rendered.append(f.render(values[f.expr]))
            elif f.short in values:
                rendered.append(f.render(values[f.short]))
            else:
                raise TextFieldMissing(f"text {self.key!r} needs a value for {f.expr!r} ({f.short!r})")
        return self.template.format(*rendered)

    def sample(self) -> str | None:
        """The template filled with the recorder's samples: equal to ``text`` for a faithful recording."""
        if self.template is None:
            return None
        return self.template.format(*(f.sample for f in self.fields))

    @property
    def log_line(self) -> str | None:
        """The text as it shows up in an engine log: a raise or an assert ends its traceback with
        ``ValueError: <text>``; a message-less assert shows its source line, then ``AssertionError``."""
        if self.text is None:
            return None
        if self.emitted.startswith("raise "):
            return f"{self.emitted.split()[1]}: {self.text}"
        if self.emitted == "assert":
            return f"AssertionError: {self.text}"
        if self.emitted.startswith("assert without a message"):
            return f"    {self.text}\nAssertionError"
        return self.text


#: What vLLM's FlexibleArgumentParser makes of ``-O<level>`` (``-O3``, ``-O=3``, ``-O 3``).
OPTIMIZATION_LEVEL = "--optimization-level"


@dataclass(frozen=True)
class Contract:
    """The recorded contract of one engine version (see the module docstring)."""

    engine: str
    version: str
    prog: str
    allow_abbrev: bool
    options: tuple[Option, ...]
    server_args_fields: tuple[str, ...] = ()
    server_info_extra: tuple[str, ...] = ()
    texts: Mapping[str, RecordedText | None] = field(default_factory=dict)
    recorded_from: Mapping[str, Any] = field(default_factory=dict)
    usage: str | None = None  # vLLM: "vllm serve [model_tag] [options]"
    top_prog: str | None = None  # vLLM: the top-level parser ("vllm") that reports unrecognized flags
    positionals: tuple[str, ...] = ()
    underscores_as_dashes: bool = False  # vLLM's FlexibleArgumentParser: --tensor_parallel_size works
    http: Mapping[str, Any] = field(default_factory=dict)  # vLLM: /health, /version, /v1/models, metrics

    # ---- loading

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Contract:
        """Inverse of the recorder's JSON; a future schema is a friendly error."""
        if data.get("schema") != SCHEMA:
            raise BenchbotError(f"contract schema {data.get('schema')!r} is not {SCHEMA}; upgrade benchbot")
        parser = data["parser"]
        texts: dict[str, RecordedText | None] = {}
        for key, value in (data.get("texts") or {}).items():
            texts[key] = (
                None
                if value is None
                else RecordedText(
                    key,
                    None if value.get("text") is None else str(value["text"]),
                    str(value["source"]),
                    value.get("line"),
                    str(value.get("kind") or ""),
                    str(value.get("emitted") or ""),
                    value.get("template"),
                    tuple(
                        TextField(str(f["expr"]), str(f["format"]), str(f["sample"])) for f in value.get("fields") or ()
                    ),
                )
            )
        info = data.get("server_info") or {}
        flexible = data.get("flexible") or {}
        return cls(
            engine=str(data["engine"]),
            version=str(data["version"]),
            prog=str(parser.get("prog") or "launch_server.py"),
            allow_abbrev=bool(parser.get("allow_abbrev", True)),
            options=tuple(Option.from_dict(o) for o in parser["options"]),
            server_args_fields=tuple(info.get("fields") or ()),
            server_info_extra=tuple(info.get("extra") or ()),
            texts=texts,
            recorded_from=dict(data.get("recorded_from") or {}),
            usage=parser.get("usage"),
            top_prog=parser.get("top_prog"),
            positionals=tuple(parser.get("positionals") or ()),
            underscores_as_dashes=bool((flexible.get("accepts_underscores") or {}).get("ok")),
            http=dict(data.get("http") or {}),
        )

    @functools.cached_property
    def by_flag(self) -> dict[str, Option]:
        """Every option string (aliases included) -> its option."""
        return {flag: opt for opt in self.options for flag in (*opt.flags, *opt.hidden_flags)}

    @property
    def ready_line(self) -> str | None:
        """The line the server logs once it is ready to serve."""
        return self.text("ready")

    def text(self, key: str) -> str | None:
        """A recorded text by key, or None where this version has no such text (or it was not recordable)."""
        found = self.texts.get(key)
        return found.text if found else None

    # ---- flags

    def normalize(self, flag: str) -> str:
        """The option name the parser matches: ``--x=v`` -> ``--x``; for vLLM also ``--a_b`` -> ``--a-b`` and
        ``--speculative-config.method`` -> ``--speculative-config`` (FlexibleArgumentParser's rewrites)."""
        name = flag.split("=", 1)[0]
        if self.underscores_as_dashes and name.startswith("--"):
            name = "--" + name[2:].split(".", 1)[0].rstrip("+").replace("_", "-")
        elif self.underscores_as_dashes and name.startswith("-O") and "-O" not in self.by_flag:
            # vLLM's parser rewrites -O3, -O=3 and -O 3 to --optimization-level (judged as that: issue 39)
            name = OPTIMIZATION_LEVEL if OPTIMIZATION_LEVEL in self.by_flag else name
        return name

    def resolve(self, flag: str) -> Resolution:
        """What the engine's parser makes of ``flag`` (``--x=v`` is resolved on its name)."""
        name = self.normalize(flag)
        exact = self.by_flag.get(name)
        if exact is not None:
            return Resolution(flag, "exact", exact, name)
        if self.allow_abbrev and name.startswith("--") and len(name) > 2:
            matches = [f for f in self.by_flag if f.startswith(name)]
            if len(matches) == 1:
                return Resolution(flag, "prefix", self.by_flag[matches[0]], matches[0])
            if len(matches) > 1:
                return Resolution(flag, "ambiguous", candidates=tuple(sorted(matches)))
        nearest = difflib.get_close_matches(name, list(self.by_flag), n=3, cutoff=0.6)
        return Resolution(flag, "unknown", nearest=tuple(nearest))

    def server_arg(self, flag: str) -> str | None:
        """The key ``/server_info`` reports this flag under (``--tp`` -> ``tp_size``), or None."""
        res = self.resolve(flag)
        if res.option is None:
            return None
        fields = set(self.server_args_fields)
        if not fields or res.option.dest in fields:
            return res.option.dest
        for spelling in res.option.flags:
            candidate = spelling.lstrip("-").replace("-", "_")
            if candidate in fields:
                return candidate
        return res.option.dest

    def label(self) -> str:
        """``SGLang 0.5.23`` (for messages)."""
        return f"{display_name(self.engine)} {self.version}"

    def problem(self, flag: str, value: FlagValue | Sequence[str] | None = True) -> FlagProblem | None:
        """Why the engine would refuse ``flag`` with ``value`` (True = given bare), or None when it accepts."""
        res = self.resolve(flag)
        who = self.label()
        if res.kind == "unknown":
            near = f" (nearest: {', '.join(res.nearest)})" if res.nearest else ""
            return FlagProblem(flag, f"{who} has no option {flag}{near}")
        if res.kind == "ambiguous":
            shown = ", ".join(res.candidates[:6]) + (", ..." if len(res.candidates) > 6 else "")
            return FlagProblem(flag, f"{flag} is ambiguous in {who}: it could be {shown}; write the whole name")
        opt = res.option
        assert opt is not None
        if opt.takes_value and value is True:
            return FlagProblem(flag, f"{res.flag} needs a value in {who}")
        if not opt.takes_value:
            if value is not True:
                return FlagProblem(flag, f"{res.flag} takes no value in {who} (give it bare)")
            return None
        items = [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
        for item in items:
            if opt.choices is not None and item not in opt.choices:
                close = difflib.get_close_matches(item, list(opt.choices), n=1, cutoff=0.5)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                return FlagProblem(flag, f"{res.flag} {item}: {who} accepts only {', '.join(opt.choices)}{hint}")
            if opt.type in ("int", "float"):
                try:
                    int(item) if opt.type == "int" else float(item)
                except ValueError:
                    kind = "an integer" if opt.type == "int" else "a number"
                    return FlagProblem(flag, f"{res.flag} {item}: {who} expects {kind}")
        return None

    def check_flags(self, flags: Iterable[tuple[str, FlagValue | Sequence[str]]]) -> list[FlagProblem]:
        """Every problem the engine would have with these flags, in order."""
        return [p for flag, value in flags if (p := self.problem(flag, value)) is not None]

    def canonical(self, flag: str) -> str:
        """The full option string a flag resolves to (``--tp`` -> ``--tp-size``); unchanged when it does not."""
        res = self.resolve(flag)
        return res.flag if res.flag is not None else flag

    # ---- the parser itself

    def build_parser(self, prog: str | None = None, *, exit_on_error: bool = True) -> argparse.ArgumentParser:
        """The engine's launch parser rebuilt from the contract: same names, dests, choices, defaults and
        prefix matching, so its errors read as the real ones do (``error: unrecognized arguments: ...``)."""
        parser = argparse.ArgumentParser(
            prog=prog or self.prog, allow_abbrev=self.allow_abbrev, exit_on_error=exit_on_error, add_help=False
        )
        for opt in self.options:
            add_option(parser, opt)
        return parser


_TYPES: dict[str, Callable[[str], object]] = {"int": int, "float": float, "str": str, "loads": json.loads}


def add_option(parser: argparse.ArgumentParser, opt: Option) -> None:
    """Add one recorded option to an argparse parser, mapping the engine's custom actions to argparse's."""
    kwargs: dict[str, Any] = {"dest": opt.dest}
    flags = list(opt.flags)
    action = opt.action
    if action == "help":
        parser.add_argument(*flags, action="help")
        return
    if action == "custom":
        cls = opt.action_class or ""
        if cls == "EnableDisableAction":  # vLLM: --enable-x stores True, --disable-x / --no-enable-x False
            positive = [f for f in (*flags, *opt.hidden_flags) if f not in opt.negative_flags]
            negative = [f for f in (*flags, *opt.hidden_flags) if f in opt.negative_flags]
            parser.add_argument(*positive, dest=opt.dest, action="store_const", const=True, default=opt.default)
            if negative:
                parser.add_argument(*negative, dest=opt.dest, action="store_const", const=False, default=opt.default)
            return
        if cls == "BooleanOptionalAction":
            parser.add_argument(
                *[f for f in flags if not f.startswith("--no-")],
                dest=opt.dest,
                action=argparse.BooleanOptionalAction,
                default=opt.default,
            )
            return
        if not opt.takes_value:
            action = "store_const"
            kwargs["const"] = True if opt.const is None else opt.const
        else:
            action = "store"
            if opt.nargs is not None:
                kwargs["nargs"] = opt.nargs
            # argparse converts with ``type`` before any action runs, custom ones included (SGLang
            # 0.5.14-0.5.19's DeprecatedAliasStoreAction for --cuda-graph-bs stores ints)
            if opt.type in _TYPES and opt.type != "str":
                kwargs["type"] = _TYPES[opt.type]
    elif action in ("store", "append"):
        if opt.nargs is not None:
            kwargs["nargs"] = opt.nargs
        if opt.type in _TYPES and opt.type != "str":
            kwargs["type"] = _TYPES[opt.type]
        if opt.choices is not None:
            # vLLM's backend options normalise with a lambda (lower-case, "-" -> "_"), then check choices
            kwargs["choices"] = list(opt.choices) if opt.type in (None, "str", "<lambda>") else None
            if kwargs["choices"] is None:
                kwargs.pop("choices")
    elif action in ("store_const", "append_const"):
        kwargs["const"] = opt.const
    kwargs["action"] = action
    kwargs["default"] = opt.default
    if opt.required:
        kwargs["required"] = True
    parser.add_argument(*flags, **kwargs)


# --------------------------------------------------------------------------------------------- loading


def contract_path(engine: str, version: str) -> Path:
    """Where the recorded contract of ``engine`` ``version`` lives in the package."""
    return CONTRACTS_DIR / f"{engine}-{version}.json"


def recorded_versions(engine: str = DEFAULT_KIND) -> list[str]:
    """Versions with a recorded contract, oldest first."""
    found = [p.name[len(engine) + 1 : -len(".json")] for p in CONTRACTS_DIR.glob(f"{engine}-*.json")]
    return sorted(found, key=parse_version)


@functools.lru_cache(maxsize=32)
def load_contract(engine: str, version: str) -> Contract:
    """The recorded contract of ``engine`` ``version``; :class:`UnknownVersion` when none was recorded.

    A local version label names a build of the same release (PEP 440: ``0.32.0+cpu`` is vLLM 0.32.0's
    CPU build, whose package reports it so), so it reads that release's contract when it has none of its own.
    """
    path = contract_path(engine, version)
    if not path.is_file() and "+" in version:
        path = contract_path(engine, version.split("+", 1)[0])
    if not path.is_file():
        known = ", ".join(recorded_versions(engine)) or "none"
        raise UnknownVersion(f"no recorded contract for {engine} {version} (recorded: {known})")
    return Contract.from_dict(json.loads(path.read_text(encoding="utf-8")))


def contract_or_newest(engine: str, version: str | None) -> Contract | None:
    """The recorded contract of ``engine`` ``version``, else its newest recorded one (None when none is recorded)."""
    if version:
        try:
            return load_contract(engine, version)
        except UnknownVersion:
            pass
    known = recorded_versions(engine)
    return load_contract(engine, known[-1]) if known else None


def all_contracts(engine: str = DEFAULT_KIND) -> list[Contract]:
    """Every recorded contract of ``engine``, oldest first."""
    return [load_contract(engine, v) for v in recorded_versions(engine)]
