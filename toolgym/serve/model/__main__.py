"""``python -m toolgym.serve.model``: the same as ``toolgym serve model``."""

from toolgym.serve.model import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
