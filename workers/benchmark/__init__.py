"""Benchmarking: the load generator, its metrics, and the workload shapes and statistics a /bench asks for.

One job per module:

- ``client``: the closed-loop streaming load generator (aiohttp + uvloop hot path), sharded over processes;
- ``metrics``: per-request records and per-level figures (TTFT, ITL, TPOT, throughput, client load);
- ``spec``: what a ``/bench`` asks for (levels, lengths, requests, warmup);
- ``schedule``: open-loop arrivals (Poisson or constant rate), a pacer, and the schedule lag it reports;
- ``lengths``: input/output length distributions (``in=1024``, ``in=512-2048``, ``out=dataset``);
- ``prompts``: prompts made locally (token ids or text of a requested length, optional shared prefix)
  and the per-request plan that combines lengths, prompts and a dataset;
- ``dataset``: a JSONL (or JSON array) file of ShareGPT / OpenAI ``messages`` conversations;
- ``tokens``: counting tokens without downloading a tokenizer (an approximation, or SGLang's ``/tokenize``);
- ``stats``: mean and 95 % confidence interval over ``repeat=N`` runs, and the verdict of a comparison;
- ``slo``: SLO parsing, goodput, and the search for the highest load that meets the SLOs;
- ``units``: the ``500ms`` / ``2m`` style durations the grammar accepts.

Definitions of every figure are in docs/metrics.md.
"""
