"""Turn-level credit vs outcome-only GRPO on ``toolgym/CalculatorChain-v0``, measured on held-out tasks.

Protocol v2 (docs/credit.md states it in full; every arm identical except the ``advantage`` estimator):

1. The task: CalculatorChain-v0 with ``answer_step=True`` (chains of 2 dependent steps): the process reward pays
   each verified chain value *and* the answer turn (the final value answered with no call after the chain), and a
   call after the chain is complete loses a share; process rewards stay below a right outcome.
2. One warm start, shared by every arm: a few masked-SFT steps of the embedded SmolLM2-135M on oracle episodes of
   the ``train`` split.
3. For each training seed (5) and estimator (``outcome``, ``turn_return``, ``gigpo``): GRPO through
   :func:`trainers.grpo.build_trainer` from the warm-start weights, the same train tasks and seed, a linear
   learning-rate warm-up, until the same budget of **generated policy tokens** is spent (``token_budget``; the
   step that crosses it finishes). Every turn-level arm is also evaluated when it crosses ``mid_fraction`` (60%)
   of the budget.
4. Held-out evaluation of every model: ``eval_tasks`` distinct ``test``-split chains, fixed seeds, greedy. Per seed:
   paired 95% CIs over tasks (arm - outcome). Across seeds: the paired t-interval over the per-seed differences and
   a hierarchical bootstrap (seeds, then tasks within a seed) 95% CI.
5. Verdict: turn-level credit helps when, across seeds, its held-out success at 60% of the budget reaches outcome's
   final success (the across-seed CI of mid - outcome-final excludes values below 0 by its lower end >= 0 and its
   mean >= 0), or its final success beats outcome's (the across-seed CI excludes 0); otherwise it does not.

Knobs chosen before any test-split run: ``--validate`` runs ``outcome`` and ``turn_return`` at each candidate
gamma on one seed and evaluates on a validation draw of ``train`` tasks (disjoint ids from the GRPO draws); it
checks that outcome-only GRPO learns (validation success above the warm start's) and picks gamma by the rule in
docs/credit.md. Nothing is chosen on the held-out tasks.

Resumable stages (:mod:`benchmarks.credit.stages`): the warm start, its evaluation and every arm (with its
mid-budget and final evaluations) is a stage keyed by a hash of its configuration. A finished stage leaves
``OUTPUT/<stage>-<key>/done.json`` and a small record ``RESULTS/<stage>-<key>.json`` (default
``benchmarks/credit/results/``, committed) and is skipped by a rerun; an arm cut short resumes from its last GRPO
checkpoint (every ``save_steps`` steps and its last step). The verdict is computed from the records alone
(``--report``), so a run continues on another machine with what remains. ``OUTPUT/results.json`` and
``OUTPUT/credit.png`` collect the finished arms after each one.

The modules: :mod:`~benchmarks.credit.protocol` (the knobs and the stages of a run),
:mod:`~benchmarks.credit.stages` (keys, records, checkpoints), :mod:`~benchmarks.credit.train` (the warm start
and the arms), :mod:`~benchmarks.credit.verdict.verdict` (the statistics and the rule), :mod:`~benchmarks.credit.report`
(the results from the records, the table, the plot), :mod:`~benchmarks.credit.run` (the command line).

Run::

    python -m benchmarks.credit --validate --output-dir runs/credit-validation   # the knobs, on train tasks
    python -m benchmarks.credit --gamma G --output-dir runs/credit               # the comparison (resumable)
    python -m benchmarks.credit --gamma G --report                               # table and verdict from records
    python -m benchmarks.credit --smoke --output-dir runs/credit-smoke           # the pipeline end to end
"""
