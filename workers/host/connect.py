"""Open the transport a host's config asks for: local (this machine) or SSH."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from workers.errors import TransportError
from workers.host.local import LocalTransport
from workers.host.ssh import SshTransport
from workers.host.transport import Transport


class HostLike(Protocol):
    """The attributes of ``workers.config.HostConfig`` that choosing a transport needs (duck typed)."""

    @property
    def name(self) -> str: ...
    @property
    def transport(self) -> str: ...  # "local" | "ssh"
    @property
    def ssh_target(self) -> str | None: ...
    @property
    def ssh_port(self) -> int | None: ...
    @property
    def ssh_user(self) -> str | None: ...
    @property
    def ssh_key(self) -> str | None: ...
    @property
    def ssh_known_hosts(self) -> str | None: ...
    @property
    def ssh_insecure_no_host_check(self) -> bool: ...
    @property
    def env(self) -> Mapping[str, str] | None: ...


def open_transport(host: HostLike) -> Transport:
    """The transport a host's config asks for; raises TransportError for an unknown kind."""
    kind = getattr(host, "transport", "local")
    env = getattr(host, "env", None) or None
    if kind == "local":
        return LocalTransport(name=host.name, env=env)
    if kind == "ssh":
        target = getattr(host, "ssh_target", None)
        if not target:
            raise TransportError(f"host {host.name!r} uses ssh but has no ssh_target")
        return SshTransport(
            target,
            getattr(host, "ssh_port", None) or 22,
            username=getattr(host, "ssh_user", None),
            key_path=getattr(host, "ssh_key", None),
            known_hosts=getattr(host, "ssh_known_hosts", None),
            insecure_no_host_check=bool(getattr(host, "ssh_insecure_no_host_check", False)),
            name=host.name,
            env=env,
        )
    raise TransportError(f"host {host.name!r}: unknown transport {kind!r} (use 'local' or 'ssh')")
