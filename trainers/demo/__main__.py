"""``python -m trainers.demo``: the demo (``make demo``)."""

from trainers.demo import main

main()
