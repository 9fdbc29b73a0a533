"""``python -m trainers.dpo ARGS`` = ``toolgym train dpo ARGS``."""

import sys

from trainers.cli import main

sys.exit(main(["dpo", *sys.argv[1:]]))
