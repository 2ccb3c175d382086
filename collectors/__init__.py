"""One module per source of signals; each returns a Batch and never raises into the daemon."""
