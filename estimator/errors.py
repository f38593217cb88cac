"""The estimator's error for options that do not describe one load."""

from __future__ import annotations


class UsageError(ValueError):
    """A combination of options that does not describe one load (exit status 2)."""
