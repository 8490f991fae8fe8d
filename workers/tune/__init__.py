"""``/tune``: a search for the best config under an SLO (space, study, trial, confirmation)."""
