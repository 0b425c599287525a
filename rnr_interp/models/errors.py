"""The one error a model spec, device or dtype that cannot be used raises."""

from __future__ import annotations


class ModelSpecError(ValueError):
    """A model spec that cannot be loaded; the message is one line naming why."""
