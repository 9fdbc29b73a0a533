"""Tools that put toolgym on another machine and check it there, not measurements: :mod:`deploy.gpu_bundle` packs
what a compute node without a package index needs (wheels, the embedded model, this checkout) and
:mod:`deploy.gpu_check` runs the GPU acceptance check on it (docs/training.md, "On a GPU"). Run from the
repository root: ``python -m deploy.gpu_check``."""
