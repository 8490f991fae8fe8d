"""GPU and server telemetry sampled while a bench level runs (issue 22): parsers, sampler, summaries."""
