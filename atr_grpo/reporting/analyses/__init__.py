"""The analyses of a set of runs: tables, seed-level tests, comparisons, noise and timing."""
