"""``python -m toolgym.cli``: the ``toolgym`` command."""

import sys

from toolgym.cli.main import main

sys.exit(main())
