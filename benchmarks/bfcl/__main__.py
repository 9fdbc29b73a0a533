"""``python -m benchmarks.bfcl``: :func:`benchmarks.bfcl.run.main`."""

from benchmarks.bfcl.run import main

main()
