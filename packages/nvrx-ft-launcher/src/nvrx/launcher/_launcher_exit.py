"""The exception that ends the launcher with an exit code, after the workers were stopped.

Raised by the agent, the cluster features' steps and the start-up checks; caught once,
by :mod:`._launch`, which turns it into the launcher's exit code. Its own module, so
every module that raises it imports it without importing the agent.
"""

from __future__ import annotations

__all__: list[str] = []


class LauncherExit(Exception):
    """Ends the launcher with ``code`` after the workers were stopped."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
