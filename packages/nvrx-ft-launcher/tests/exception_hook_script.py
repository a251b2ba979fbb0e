"""A rank that starts a non-daemon thread (as a data loader would) and then raises.

Without ``install_exception_hook`` the interpreter waits for that thread at exit, so
the rank would hang for ten minutes; with it, the rank logs the traceback and exits 1.
"""

from __future__ import annotations

import threading
import time

from nvrx.ft import RankMonitorClient

client = RankMonitorClient()
client.init_workload_monitoring()
threading.Thread(target=time.sleep, args=(600,), name="loader", daemon=False).start()
print("raising now", flush=True)
raise RuntimeError("boom from the exception hook test")
