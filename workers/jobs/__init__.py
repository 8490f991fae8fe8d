"""Jobs and the lease: per-host queues, the exclusive fenced lease, job events, the job context
and the job bodies RQ runs."""
