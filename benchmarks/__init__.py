"""toolgym's measurements, each run as a module from the repository root (``python -m benchmarks.<name>``).

* ``benchmarks/<name>.py``: one measurement script each (speed, memory, agreement), side by side with what it is
  compared to (docs/benchmarks.md);
* ``benchmarks/bfcl/``, ``benchmarks/credit/``: the experiment protocols, each a folder with its modules, its
  README and its committed stage records (``results/``);
* ``benchmarks/common/``: what they share (stages, locks, machine records, statistics across seeds).

A script imports :mod:`benchmarks.common` and the library, never another script.
"""
