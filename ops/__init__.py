"""Operations tooling: deployment files rendered from the config (no link to the bot or the workers' jobs)."""
