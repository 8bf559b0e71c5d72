"""The probe command for the tiny server: prints its figures as one JSON line.

A second argument names a marker file: if the file exists, delete it and SIGKILL the server first (the test
killing a server mid-trial); the figures request then fails and this exits non-zero.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import urllib.request

base_url = sys.argv[1]
repeat = os.environ.get("SPEEDTRAP_REPEAT", "0")
marker = sys.argv[2] if len(sys.argv) > 2 else None
if marker and os.path.exists(marker):
    os.remove(marker)
    with urllib.request.urlopen(f"{base_url}/pid", timeout=5) as r:
        os.kill(json.load(r)["pid"], signal.SIGKILL)
try:
    with urllib.request.urlopen(f"{base_url}/figures?repeat={repeat}", timeout=30) as r:
        print(json.dumps({"metric": json.load(r)["metric"]}))
except OSError as exc:
    print(f"probe failed: {exc}", file=sys.stderr)
    sys.exit(1)
