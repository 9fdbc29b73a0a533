"""``python -m benchmarks.credit``: :func:`benchmarks.credit.run.main`."""

import sys

from benchmarks.credit.run import main

sys.exit(main())
