"""The one exception family whose messages are fit to show a user.

Anything that is not a ``BenchbotError`` is a bug: front ends log it and show a generic apology.
"""

from __future__ import annotations


class BenchbotError(Exception):
    """An error whose message is written for the person who typed the command."""


class ConfigError(BenchbotError):
    """The configuration file (or the embedded default) is invalid."""


class TransportError(BenchbotError):
    """A command on the GPU host could not be run (connection refused, timeout, ...)."""


class LeaseLostError(BenchbotError):
    """The worker no longer holds the exclusive lease on its host and must stop touching it."""


class EngineError(BenchbotError):
    """The engine failed to start, answered garbage, or could not be observed."""


class StaleFenceError(LeaseLostError):
    """The host itself refused an action: a newer job claimed it since this one took the lease."""
