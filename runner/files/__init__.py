"""The files a run reads and writes: input samples, output paths and their plan, the run directory,
artifacts sorted by verdict, the replay of verdicts with the run's identity, the repro bundle, tactic
records."""
