"""Independent answer extraction to check ours against: lm-eval-harness's filters,
reimplemented verbatim from lm-eval 0.4.13, so that the comparisons read as plain
code. `make setup` installs lm-eval 0.4.13 itself without its dependencies (some forty
packages the filters do not need), and `test_references_match_lm_eval_itself` checks
these copies against its real classes. math-verify is used as installed.

Sources (lm-eval 0.4.13):
- lm_eval/tasks/gsm8k/gsm8k-cot-zeroshot.yaml: strict-match regex
  "The answer is (\\-?[0-9\\.\\,]+)." (the phrasing our GSM8K instruction asks for),
  flexible-extract regex "(-?[$0-9.,]{2,})|(-?[0-9]+)" with group_select -1; both then
  take_first. Metric exact_match with regexes_to_ignore [",", "\\$", "(?s).*#### ",
  "\\.$"], ignore_case.
- lm_eval/filters/extraction.py: RegexFilter.apply and MultiChoiceRegexFilter.apply,
  as configured by lm_eval/tasks/mmlu/flan_n_shot/generative (regex "(\\([A-Z]\\))",
  group_select 0, ignore_case, ignore_punctuation).
"""

from __future__ import annotations

import re
import sys
import unicodedata

FALLBACK = "[invalid]"
GSM8K_STRICT = r"The answer is (\-?[0-9\.\,]+)."
GSM8K_FLEXIBLE = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
GSM8K_IGNORE = [",", "\\$", "(?s).*#### ", "\\.$"]
MC_REGEX = r"(\([A-Z]\))"


def regex_filter(resp: str, pattern: str, group_select: int = 0) -> str:
    """lm_eval.filters.extraction.RegexFilter.apply for one response."""
    match = re.compile(pattern).findall(resp)
    if match:
        match = match[group_select]
        if isinstance(match, tuple):
            match = [m for m in match if m]
            match = match[0] if match else FALLBACK
        return match.strip()
    return FALLBACK


def exact_match(prediction: str, reference: str, regexes_to_ignore=GSM8K_IGNORE, ignore_case=True) -> bool:
    """lm_eval.api.metrics.exact_match_hf_evaluate for one pair (no punctuation or
    number stripping, as the GSM8K tasks configure it)."""
    for s in regexes_to_ignore:
        prediction, reference = re.sub(s, "", prediction), re.sub(s, "", reference)
    if ignore_case:
        prediction, reference = prediction.lower(), reference.lower()
    return prediction == reference


def gsm8k_strict(resp: str) -> str:
    return regex_filter(resp, GSM8K_STRICT)


def gsm8k_flexible(resp: str) -> str:
    return regex_filter(resp, GSM8K_FLEXIBLE, group_select=-1)


_PUNCT = dict.fromkeys(i for i in range(sys.maxunicode) if unicodedata.category(chr(i)).startswith("P"))


def multi_choice(resp: str, choices: list[str], group_select: int = 0) -> str:
    """lm_eval MultiChoiceRegexFilter.apply for one response: "(A)".. or "[invalid]"."""
    return multi_choice_step(resp, choices, group_select)[0]


def multi_choice_step(resp: str, choices: list[str], group_select: int = 0) -> tuple[str, str | None]:
    """`multi_choice` and which of its steps answered: "(X)" (the regex "(X)"), "option
    text" (an option's text anywhere, case and punctuation ignored), ": X" (a colon, then
    a letter), or None (the fallback)."""

    def find_match(regex, text, convert=None):
        match = regex.findall(text)
        if match:
            match = match[group_select]
            if isinstance(match, tuple):
                non_empty = [m for m in match if m]
                if not non_empty:
                    return ""
                match = non_empty[0]
            match = match.strip()
            if match and convert and match in convert:
                match = convert[match]
        return match

    def ignores(st: str) -> str:
        return st.lower().translate(_PUNCT)

    choice_to_alpha, fallback, letters, letter_to_target = {}, [], [], {}
    for i, c in enumerate(choices):
        m = ignores(c.strip())
        alpha = chr(ord("A") + i)
        fallback.append(re.escape(m))
        choice_to_alpha[m] = f"({alpha})"
        letters.append(alpha)
        letter_to_target[alpha] = f"({alpha})"
    fallback_regex = re.compile("|".join(sorted(fallback, key=len, reverse=True)))
    letter_regex = re.compile(rf":[\s]*({'|'.join(letters)})")
    for step, regex, text, convert in [("(X)", re.compile(MC_REGEX), resp, None),
                                       ("option text", fallback_regex, ignores(resp), choice_to_alpha),
                                       (": X", letter_regex, resp, letter_to_target)]:
        match = find_match(regex, text, convert)
        if match:
            return match, step
    return FALLBACK, None
