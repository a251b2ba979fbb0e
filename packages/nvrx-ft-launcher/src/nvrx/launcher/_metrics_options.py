"""The argparse types of ``--ft-metrics-textfile`` and ``--ft-metrics-pushgateway``.

Checked at start-up, before anything runs: a bad value is exit 2 naming the option and
the value (a textfile path is also refused where another user could replace it, as the
launcher's other outputs are: :func:`nvrx.launcher._validation.unsafe_output_path`).
"""

from __future__ import annotations

import argparse
import os

__all__ = ["metrics_textfile", "pushgateway_url"]


def metrics_textfile(text: str) -> str:
    """An argparse type: a file to write in an existing directory (issue 25 item 5)."""
    directory = os.path.dirname(os.path.abspath(text))
    if not text or text.endswith(os.sep) or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected a file name")
    if not os.path.isdir(directory):
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: the directory {directory!r} does not exist"
        )
    return text


def pushgateway_url(text: str) -> str:
    """An argparse type: a Pushgateway address, http(s)://HOST[:PORT][/PATH] or HOST:PORT."""
    import urllib.parse

    url = text if "://" in text else f"http://{text}"
    try:
        parts = urllib.parse.urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        parts, port_ok = None, False
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: expected a Pushgateway URL, http(s)://HOST[:PORT]"
        )
    return text
