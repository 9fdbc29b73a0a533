"""Reports on trajectories and training runs: the self-contained HTML trajectory viewer
(:mod:`toolgym.report.viewer`, ``toolgym view``) and PNG plots of training curves and tool latencies
(:mod:`toolgym.report.plots`, ``toolgym plot``). Both read files only; nothing here imports torch or training code.
"""
