"""Where checks run: one after another in the runner (``serial``), several at once on this machine
in threads (``local``) or in worker processes pinned to GPUs (``processes``), or as tasks on a Dask
distributed cluster (``dask``). One module per executor; the
shared interface and the check task are in ``base``, a running check's slot in ``slot``."""
