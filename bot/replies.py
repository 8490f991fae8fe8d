"""What a front end gets back from the dispatcher: one shape for Slack, the console and ``say``.

``Reply.to_dict()`` is the documented, stable ``--json`` shape (schema 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reply:
    """The answer to one command.

    ``ok`` False means the command was refused (bad input, access) and nothing changed: ``say``
    exits 2. ``job_id`` is set when a job was queued; its story then continues as events.
    """

    ok: bool
    kind: str  # help | error | denied | queued | status | queue | cancel | runs | compare | tagged
    text: str
    ephemeral: bool = True
    job_id: str | None = None
    data: dict[str, object] = field(default_factory=dict)
    files: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        """The ``--json`` shape."""
        return {
            "schema": 1,
            "ok": self.ok,
            "kind": self.kind,
            "text": self.text,
            "job_id": self.job_id,
            "data": self.data,
            "files": list(self.files),
        }


def refused(message: str, kind: str = "error") -> Reply:
    """A refusal that changed nothing."""
    return Reply(ok=False, kind=kind, text=message)
