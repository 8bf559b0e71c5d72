"""Progress in a log: a timestamped line per step, and a heartbeat when a step runs long."""

from __future__ import annotations

import io
import itertools
import re
import time

from rich.console import Console

from speedtrap.progress import LogProgress, RichProgress, for_console


def test_a_log_gains_a_line_per_step_and_a_heartbeat_between() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    assert isinstance(for_console(console), LogProgress)
    assert isinstance(for_console(Console(file=io.StringIO(), force_terminal=True)), RichProgress)
    with LogProgress(console, heartbeat_s=0.3) as log:
        log.start("probes", 2)
        log.advance("probes", 1, "recall: baseline (20/20 right)")
        time.sleep(1.0)  # a long step: the heartbeat speaks
        log.advance("probes", 1, "recall: all patches (11/20 right)")
        log.done("probes", "done")
    lines = out.getvalue().splitlines()
    stamps = [float(m.group(1)) for line in lines if (m := re.match(r"\[\s*([\d.]+) s\] ", line))]
    assert len(stamps) == len(lines) and stamps == sorted(stamps)
    assert "probes 1/2: recall: baseline (20/20 right)" in lines[1]
    beats = [line for line in lines if "probes 1/2: still working" in line]
    assert 2 <= len(beats) <= 4  # every 0.3 s of silence, not more often
    assert max(b - a for a, b in itertools.pairwise(stamps)) < 0.3 + 0.5
    assert lines[-1].endswith("probes: done")
