"""Gang jobs (issue 38): one job on every host of a group, under every member's lease, its ranks launched,
watched and stopped together."""
