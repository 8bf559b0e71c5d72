"""Probes through injected faults: a fault proxy between the probes and a real ``speedtrap serve``.

Ground truth is the clean run through the same proxy at rate 0. Through 10 % faults the figures are
the same, and every faulted request was sent again and answered cleanly afterwards (the proxy's log
of requests by content): no faulted answer was scored, since one that was would have had no retry.
"""

from __future__ import annotations

from typing import Any

import pytest
from fault_proxy import KINDS, FaultProxy
from probe_helpers import HTTP_GRID, Server

from speedtrap.probe import DivergenceSettings, HttpBackend, run_divergence, run_recall

RATE = 0.10
# The client's timeout: a stall lasts just past it, so each probe waits this long once. An answer here (4
# questions at 256 tokens, or 4 sequences of 96) takes about a second on a busy 2-core machine.
TIMEOUT_S = 15.0
DIVERGENCE = DivergenceSettings(lengths=(96,), sequences=4, decode_tokens=8, bucket_size=32)


def _backend(url: str) -> HttpBackend:
    return HttpBackend(url, "smol-moe", concurrency=1, timeout=TIMEOUT_S, backoff=0.05, retries=6)


def _recall(url: str) -> Any:
    report = run_recall(_backend(url), HTTP_GRID, progress=False)
    return report.answers(), report.overall


def _divergence(reference_url: str, url: str) -> Any:
    report = run_divergence(_backend(reference_url), _backend(url), DIVERGENCE, progress=False)
    return report.to_json()["phases"]


@pytest.mark.slow
@pytest.mark.parametrize("probe", ["recall", "divergence"])
def test_a_probe_through_ten_percent_faults_reports_the_clean_figures(served: Server, probe: str) -> None:
    def measure(url: str) -> Any:
        return _recall(url) if probe == "recall" else _divergence(url, url)

    with FaultProxy(served.url, 0.0) as clean_proxy:
        clean = measure(clean_proxy.url)
    # Faults of each kind in turn; the two probes start apart so that between them every kind is injected.
    first = 0 if probe == "recall" else 3
    with FaultProxy(served.url, RATE, KINDS, seed=1, stall_s=TIMEOUT_S + 1, first=first) as proxy:
        faulted = measure(proxy.url)
    print(f"\n{probe}: {proxy.requests} requests, faults injected: {dict(proxy.faults)}")
    assert sum(proxy.faults.values()) >= 1, "no fault was drawn: raise the grid or change the seed"
    assert faulted == clean
    assert proxy.unanswered() == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["truncate", "cut", "5xx", "drop"])
def test_an_answer_cut_short_every_time_is_an_error_never_a_figure(served: Server, kind: str) -> None:
    from speedtrap._errors import ServerError

    with FaultProxy(served.url, 1.0, (kind,)) as proxy, pytest.raises(ServerError) as info:
        _recall(proxy.url)
    assert "\n" not in info.value.one_line()
    assert proxy.requests >= 7  # a request tried 1 + 6 times, then the probe stops
