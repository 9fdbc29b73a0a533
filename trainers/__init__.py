"""Thin training adapters around toolgym (TRL 1.16 GRPO ``rollout_func``, RFT/SFT on trajectories, launch configs).

The core library ``toolgym`` never imports this package; this package imports TRL, torch and transformers.
"""

from __future__ import annotations

TRL_VERSION = "1.16.0"
"""The TRL version the adapter was written and tested against (``rollout_func`` is experimental there)."""

__all__ = ["TRL_VERSION"]
