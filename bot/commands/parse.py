"""The entry points: a line or a slash command's text -> a typed request or a :class:`ParseError`.

They never raise, whatever the input: a refusal and even a parser bug come back as a polite ParseError.
"""

from __future__ import annotations

import re

from bot.commands.help import COMMANDS
from bot.commands.requests import ParseError, Request
from bot.commands.tokens import _check_text, tokenize
from workers.config import Config
from workers.errors import BenchbotError
from workers.presets import suggest


def parse_command(name: str, text: str, config: Config) -> Request | ParseError:
    """Parse the text of a slash command whose name arrives separately (as Slack sends it)."""
    try:
        command = name.strip().lstrip("/").lower()
        if command not in COMMANDS:
            return ParseError(f'no command "/{command[:40]}"{suggest(command, COMMANDS)}. Try /help')
        tokens = tokenize(text, config)
        return COMMANDS[command].parser(tokens, config)
    except BenchbotError as exc:
        return ParseError(str(exc), command=name.strip().lstrip("/").lower() or None)
    except Exception as exc:  # the parser must never raise; a bug still gets a polite answer
        return ParseError(f"could not understand that command ({type(exc).__name__}); see /help")


def parse(line: str, config: Config) -> Request | ParseError:
    """Parse a whole line such as ``/launch nextn cudnn`` (the leading slash is optional)."""
    try:
        stripped = line.strip()
        if not stripped:
            return ParseError("type a command, e.g. /help")
        name, _, rest = stripped.partition(" ")
        if not re.fullmatch(r"/?[A-Za-z]{1,20}", name):
            _check_text(stripped, config)
            return ParseError(f'"{name[:40]}" is not a command. Try /help')
        return parse_command(name, rest, config)
    except BenchbotError as exc:
        return ParseError(str(exc))
    except Exception as exc:
        return ParseError(f"could not understand that command ({type(exc).__name__}); see /help")
