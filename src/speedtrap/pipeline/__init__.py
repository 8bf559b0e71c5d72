"""The whole hunt in one call: triage -> probes -> isolate -> localize -> report, into a run directory.

::

    from speedtrap.pipeline import PipelineSettings, run_pipeline
    from speedtrap.report import Source
    result = run_pipeline(Path("speedtrap-runs/demo"), Source(target="smol-moe"), PipelineSettings(quick=True))
    print(result.data.verdict.headline, result.html)
"""

from __future__ import annotations

from speedtrap.pipeline._run import PipelineResult, run_pipeline
from speedtrap.pipeline._settings import PipelineSettings, demo_settings
from speedtrap.progress import NoProgress, Progress

__all__ = ["NoProgress", "PipelineResult", "PipelineSettings", "Progress", "demo_settings", "run_pipeline"]
