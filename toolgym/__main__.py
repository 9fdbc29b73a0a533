"""``python -m toolgym``: the ``toolgym`` command."""

from toolgym.cli import main

raise SystemExit(main())
