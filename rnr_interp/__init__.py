"""rnr_interp: realized vs reachable, question by question.

Start with `models.load_model`, `tasks.load_task` and `audit.run_audit`; the README maps
the rest (one concept per module).
"""

__version__ = "0.1.0"
