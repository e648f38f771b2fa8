"""One run from its config to its summary: the plan, the assembly of its parts, the summary record
and sweeps."""
