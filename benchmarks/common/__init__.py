"""What the benchmarks and experiments share, and nothing that runs on its own: resumable stages, their locks and
machine records (:mod:`benchmarks.common.stages`) and statistics across training seeds
(:mod:`benchmarks.common.stats`). Scripts import this package and the library; it imports no script."""
