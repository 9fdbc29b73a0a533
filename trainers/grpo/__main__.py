"""``python -m trainers.grpo ARGS`` = ``toolgym train grpo ARGS``."""

import sys

from trainers.cli import main

sys.exit(main(["grpo", *sys.argv[1:]]))
