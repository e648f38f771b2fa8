"""What a run shows a person: console lines, the progress bar, the final table, --help, signals and closed pipes."""
