"""asyncssh, imported without the DSA deprecation warnings it sets off.

asyncssh (2.24.1) names DSA key types at import, and cryptography (51 here) warns at each name: ten
lines on the stderr of every process that imports it, a ``--json`` reply captured with ``2>&1``
included. Only that warning, raised from asyncssh's own modules, is silenced (benchbot uses no DSA
keys); every other warning shows as before. Import asyncssh from here: ``from
workers.host.asyncssh_quiet import asyncssh``.
"""

from __future__ import annotations

import warnings

from cryptography.utils import CryptographyDeprecationWarning

warnings.filterwarnings(
    "ignore", message="DSA is deprecated", category=CryptographyDeprecationWarning, module=r"asyncssh(\.|$)"
)

import asyncssh  # noqa: E402  (after the filter, which is the point of this module)

__all__ = ["asyncssh"]
