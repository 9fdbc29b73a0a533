"""A learning result on BFCL: the embedded SmolLM2-135M, untrained -> masked-SFT warm start -> GRPO, held out.

The protocol (docs/bfcl.md, "The learning experiment") in stages, each kept under ``--out`` keyed by its
configuration and skipped when the script runs again (:mod:`benchmarks.common.stages`):

* ``eval-untrained-<category>``: the untrained model on every evaluated category (greedy, so the same for every
  seed: computed once);
* ``warmstart-seed<S>``: masked SFT on oracle episodes (BFCL's ground truth) of the ``train`` split; its checkpoint;
* ``eval-warmstart-seed<S>-<category>``;
* ``grpo-seed<S>``: GRPO through the TRL adapter on the ``train`` split (one env, a category mixture), saving a
  resumable checkpoint every ``--grpo-save-steps`` steps: a killed run resumes from its last save;
* ``eval-grpo-seed<S>-<category>``.

In distribution: every ``test`` entry of ``--categories``; out of distribution (never trained on): a fixed hashed
subset of the live categories' ``test`` split (:func:`ood_ids`). Every evaluation is greedy on the same entries,
so gains are paired per entry (``toolgym.evaluation.paired_difference_ci``). Each stage runs in a fresh process
(its peak RSS is its own) and writes its result, with every entry's verdict, the training task ids, the
configuration, wall and CPU time and the machine, to ``--results`` (``benchmarks/bfcl/results/``, committed), so
the experiment continues on another machine with what remains.

    python -m benchmarks.bfcl --seeds 0 1 2            # run (or resume) the protocol
    python -m benchmarks.bfcl --seeds 0 1 2 --report   # the tables from the committed results alone

The modules: :mod:`~benchmarks.bfcl.protocol` (what fixes each stage: its key material, the evaluation plan,
the command line), :mod:`~benchmarks.bfcl.compute` (what each stage computes, in a fresh process),
:mod:`~benchmarks.bfcl.report` (the tables from the records), :mod:`~benchmarks.bfcl.run` (the driver),
:mod:`~benchmarks.bfcl.oracle` (the oracle's score per category). A second protocol keeps its records apart, in
``results/<version>/``.

``--smoke`` runs a tiny version (2 entries per category, 1 SFT and 1 GRPO step) to check the pipeline.
"""
