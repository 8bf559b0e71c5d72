"""The public-incident corpus of ``benchmarks/bench_triage_incidents.py``, in parts:

- ``case``: the ``Case`` record and the releases;
- ``cases_vllm``, ``cases_sglang``, ``cases_llamacpp``: the incidents, per corpus source;
- ``corpus``: their order (the table's) and the held-out history;
- ``split``: the development and held-out halves, by a fixed rule, recorded in full;
- ``trees``: the release trees, downloaded once and unpacked into the cache;
- ``decoys``: the culprit's diff and the decoys made by rule;
- ``runner``: one case triaged, as a row;
- ``table``: the Markdown table and the totals.
"""
