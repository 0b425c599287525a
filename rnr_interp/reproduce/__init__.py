"""The paper reproduced end to end: parts of ordinary run folders under one root,
the findings table computed from their summaries, and one index report.

Above the analyses and the report in the import order (it drives both), below the
command layer (`rnr reproduce`).
"""

from rnr_interp.reproduce.driver import reproduce
from rnr_interp.reproduce.profiles import PROFILES, Profile, get_profile

__all__ = ["PROFILES", "Profile", "get_profile", "reproduce"]
