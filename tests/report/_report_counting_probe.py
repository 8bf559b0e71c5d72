"""The tiny server's probe command that also counts: one line per measurement in ``$TINY_MEASURED``."""

from __future__ import annotations

import json
import os
import sys
import urllib.request

with urllib.request.urlopen(f"{sys.argv[1]}/figures", timeout=30) as response:
    metric = json.load(response)["metric"]
with open(os.environ["TINY_MEASURED"], "a") as log:
    log.write(f"{os.environ.get('SPEEDTRAP_CONFIG', '')}|{os.environ.get('SPEEDTRAP_REPEAT', '0')}\n")
print(json.dumps({"metric": metric}))
