"""Recognition readouts: does the model *know* the gold option, whatever it generates?

For a multiple-choice question the options are ranked by the model's likelihood,
two ways:

- ``option``: the log-prob of each option's TEXT as the assistant's reply to the bare
  question (`MultipleChoiceTask.recognition_prompt`: no letters, no instruction),
  scored as the sum over its tokens (``option:sum``) or the per-token mean
  (``option:mean``, length-normalised, so long options are not penalised for length).
- ``letter``: the log-prob of ``"Answer: X"`` after the full deployed prompt (lettered
  options and instruction). The ``"Answer: "`` prefix is common to every option, so
  this ranks the letters by the model's next-token preference after it.
- ``lm-eval`` (tasks from an lm-eval YAML only, `LmEvalMCTask`): lm-eval's own requests,
  its context then target delimiter + choice, raw text without a chat template,
  tokenized as lm-eval's `HFLM` does (`lm_eval_sequence`), read as lm-eval's ``acc``
  (``lm-eval:acc``: the sum of log-probs) and ``acc_norm`` (``lm-eval:acc_norm``: the
  sum divided by the choice's length in characters, lm-eval 0.4.13's rule).

Every sequence is a context (token ids) followed by a continuation (token ids); the
scores are exact sums of log-probs of the continuation tokens, so anyone can recompute
them from `option_sequences` with a plain forward pass. A model asked without a chat
template follows lm-eval's ``target_delimiter`` convention: the context's trailing
whitespace is dropped and the continuation is a space and then the option, so the
scored tokens are the option's as they follow a word (``" Paris"``), never glued to the
question's last token (`TARGET_DELIMITER`). Through a chat template the option is the
start of the assistant's turn, which needs no delimiter.

- ``answer`` (free-form tasks): the log-prob of the answer statement the task's
  instruction quotes (``'Answer: N'``, GSM8K's ``'The answer is N.'``) after the full
  deployed prompt, for the gold answer and its distractors (`recognition_choices`):
  those a question declares (a ``distractors`` list in its data row), else, for a
  numeric answer, its near misses (`NEAR_MISSES`: off by 1 and by 10, as
  ``arithmetic_mc``'s distractors are). The candidates are ranked in numeric order, so
  the gold's position says nothing. This is recognition without the reasoning a
  chain-of-thought task would write first.

The cell-level screen (`screen_cell`) compares a cell's recognition score with its
generation score (the paper's Figure 4a: failures lie off y = x) under a stated
`FailureCriterion`, and reads recognition against chance (one over the number of
options): a guesser recognises 1/n of the questions, so the screen asks for recognition
above chance as well as above generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

import re

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from rnr_interp.engine.generate import forward, left_pad
from rnr_interp.metrics import paired_diff_ci, wilson_interval
from rnr_interp.models import LoadedModel
from rnr_interp.engine.sampling import chunks
from rnr_interp.tasks.base import LETTERS, MultipleChoiceTask, Question, Task
from rnr_interp.tasks.numeric import canonical_number

Variant = Literal["option", "letter", "lm-eval", "answer"]
#: how the failure set reads recognition: "option:sum", "option:mean", "letter", for
#: lm-eval tasks lm-eval's own "lm-eval:acc" and "lm-eval:acc_norm", and for free-form
#: tasks "answer" (the gold's statement against its distractors')
READOUTS = ("option:sum", "option:mean", "letter", "lm-eval:acc", "lm-eval:acc_norm", "answer")
#: a numeric gold's derived distractors: these offsets from it
NEAR_MISSES = (-10, -1, 1, 10)
#: the answer statement when a task's instruction quotes none
ANSWER_STATEMENT = "Answer: {}"


def default_readout(task: Task) -> str:
    """The readout a localisation uses unless told: the option likelihoods for multiple
    choice, the answer statements for free-form tasks."""
    return "option:mean" if isinstance(task, MultipleChoiceTask) else "answer"


def answer_statement(task: Task) -> str:
    """The statement of an answer (a format string, `{}` for the answer) that `task`'s
    instruction quotes, such as 'Answer: N' or 'The answer is N.'; else `ANSWER_STATEMENT`."""
    quoted = re.search(r"'([^']*?\b[NX]\b[^']*)'", task.instruction or "")
    if quoted is None:
        return ANSWER_STATEMENT
    return re.sub(r"\b[NX]\b", "{}", quoted.group(1).replace("{", "{{").replace("}", "}}"), count=1)


def recognition_choices(task: Task, q: Question) -> tuple[tuple[str, ...], int]:
    """The candidates recognition ranks for `q` and the gold's index among them: a
    multiple-choice question's options; for a free-form one, the gold and its declared
    distractors (``meta["distractors"]``), else a number's near misses, numbers in
    numeric order."""
    if isinstance(task, MultipleChoiceTask):
        if q.choices is None or q.gold_index is None:
            raise ValueError(f"question {q.id!r} has no options to rank")
        return tuple(q.choices), q.gold_index
    declared = q.meta.get("distractors")
    if declared is not None:
        if not isinstance(declared, (list, tuple)) or not declared or not all(isinstance(d, (str, int, float)) for d in declared):
            raise ValueError(f"question {q.id!r}: distractors must be a non-empty list of answers, got {declared!r}")
        others = [str(d).strip() for d in declared if str(d).strip() != q.answer]
    elif task.answer_kind == "number" and (gold := _as_number(q.answer)) is not None:
        others = [_number_text(gold + d) for d in NEAR_MISSES]
    else:
        raise ValueError(f"question {q.id!r} of task {task.name!r} has a free-form answer and no distractors to rank it "
                         "against: declare them (a 'distractors' list in each data row) or use a multiple-choice task")
    candidates = list(dict.fromkeys([q.answer, *others]))
    numbers = [_as_number(c) for c in candidates]
    if all(n is not None for n in numbers):
        candidates = [c for _, c in sorted(zip(numbers, candidates), key=lambda x: x[0])]
    else:
        candidates.sort()
    return tuple(candidates), candidates.index(q.answer)


def _as_number(text: str) -> float | None:
    canonical = canonical_number(text)
    return None if canonical is None else float(canonical)


def _number_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


#: between context and continuation for a model without a chat template (lm-eval's
#: default ``target_delimiter``)
TARGET_DELIMITER = " "


def target_delimiter(lm: LoadedModel) -> str:
    """"" when prompts go through the model's chat template (the option opens the
    assistant's turn), else `TARGET_DELIMITER`."""
    return "" if lm.chat and lm.prompt_override is None else TARGET_DELIMITER


@dataclass(frozen=True)
class ScoredSequence:
    context: tuple[int, ...]
    continuation: tuple[int, ...]


def option_sequences(lm: LoadedModel, task: Task, q: Question, variant: Variant) -> list[ScoredSequence]:
    """One (context, continuation) per candidate of `q` (`recognition_choices`), in order."""
    if variant == "answer":
        if isinstance(task, MultipleChoiceTask):
            raise ValueError(f"the answer readout ranks free-form answers; task {task.name!r} is multiple choice "
                             "(use an option or letter readout)")
        prompt = lm.render(task.user_message(q))
        texts = [answer_statement(task).format(c) for c in recognition_choices(task, q)[0]]
    elif q.choices is None:
        raise ValueError(f"question {q.id!r} has no choices: readout {variant!r} needs a multiple-choice task "
                         "(free-form tasks: the answer readout)")
    elif variant == "option":
        prompt = lm.render(task.recognition_prompt(q))
        texts = [c.strip() for c in q.choices]
    elif variant == "letter":
        prompt = lm.render(task.user_message(q))
        texts = [f"Answer: {LETTERS[i]}" for i in range(len(q.choices))]
    elif variant == "lm-eval":
        requests = getattr(task, "loglikelihood_requests", None)
        if requests is None:
            raise ValueError(f"task {task.name!r} is not an lm-eval task: it has no lm-eval requests to score")
        return [lm_eval_sequence(lm, context, continuation) for context, continuation in requests(q)]
    else:
        raise ValueError(f"recognition variant must be 'option', 'letter', 'lm-eval' or 'answer', got {variant!r}")
    delimiter = target_delimiter(lm)
    # lm-eval moves the context's trailing whitespace into the continuation; the delimiter replaces it here
    context = lm.encode(prompt.rstrip() if delimiter else prompt)
    out = []
    for text in texts:
        cont = lm.tokenizer(delimiter + text, add_special_tokens=False).input_ids
        if not cont:
            cont = [lm.tokenizer.eos_token_id]  # an empty option: score "nothing, then end"
        out.append(ScoredSequence(tuple(context), tuple(cont)))
    return out


def lm_eval_sequence(lm: LoadedModel, context: str, continuation: str) -> ScoredSequence:
    """One lm-eval loglikelihood request as token ids, as lm-eval 0.4.13's HFLM encodes
    it: trailing whitespace of the context moves to the continuation, the whole text is
    encoded with the tokenizer's own special tokens and split after the context's
    tokens; an empty context is the BOS token (else EOS) alone."""
    encode = lm.tokenizer.encode
    if context == "":
        prefix = lm.tokenizer.bos_token_id if lm.tokenizer.bos_token_id is not None else lm.tokenizer.eos_token_id
        cont = encode(continuation, add_special_tokens=False)
        return ScoredSequence((prefix,), tuple(cont)) if cont[:1] != [prefix] else ScoredSequence(tuple(cont[:1]), tuple(cont[1:]))
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole, ctx = encode(context + continuation), encode(context)
    return ScoredSequence(tuple(ctx), tuple(whole[len(ctx):]))


@torch.inference_mode()
def continuation_logprobs(lm: LoadedModel, seqs: Sequence[ScoredSequence], batch_size: int = 8) -> list[Float[np.ndarray, "n_cont"]]:
    """Per-token log-probs of each continuation given its context (interventions in
    force, if the caller installed any). Sequences are batched by length."""
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i].context) + len(seqs[i].continuation))
    out: list[np.ndarray | None] = [None] * len(seqs)
    for idx in chunks(order, batch_size):
        full = [list(seqs[i].context) + list(seqs[i].continuation) for i in idx]
        ids, mask = left_pad(full, lm.pad_id, lm.device)
        logits, _ = forward(lm, ids, mask)
        logp: Float[Tensor, "b t v"] = torch.log_softmax(logits.float(), -1)
        width = ids.shape[1]
        for row, i in enumerate(idx):
            n = len(seqs[i].continuation)
            # Token at position p is predicted by the logits at p - 1.
            targets: Int[Tensor, "n"] = ids[row, width - n:]
            out[i] = logp[row, width - n - 1:width - 1].gather(-1, targets[:, None]).squeeze(-1).cpu().numpy()
    return out  # type: ignore[return-value]


#: each variant's normalisations: readout name -> the score of an option from its
#: summed log-prob, its token count and its text
_NORMS: dict[str, dict[str, Any]] = {
    "option": {"option:sum": lambda s, n, text: s, "option:mean": lambda s, n, text: s / n},
    "letter": {"letter": lambda s, n, text: s},
    "lm-eval": {"lm-eval:acc": lambda s, n, text: s, "lm-eval:acc_norm": lambda s, n, text: s / len(text)},
    "answer": {"answer": lambda s, n, text: s},
}


def recognize(lm: LoadedModel, task: Task, questions: Sequence[Question], batch_size: int = 8,
              variants: Sequence[Variant] = ("option", "letter")) -> list[dict[str, Any]]:
    """One row per (question, readout): per-option scores, rankings (best first) and
    whether the gold option ranks first. Option variants carry both normalisations, the
    lm-eval variant lm-eval's acc and acc_norm."""
    rows = []
    for variant in variants:
        per_q = [option_sequences(lm, task, q, variant) for q in questions]
        flat = [s for seqs in per_q for s in seqs]
        logps = continuation_logprobs(lm, flat, batch_size=batch_size)
        start = 0
        for q, seqs in zip(questions, per_q):
            lp = logps[start:start + len(seqs)]
            start += len(seqs)
            sums = np.array([float(x.sum()) for x in lp])
            lengths = np.array([len(x) for x in lp])
            choices, gold = recognition_choices(task, q)
            for readout, norm in _NORMS[variant].items():
                scores = np.array([norm(s, n, text) for s, n, text in zip(sums, lengths, choices)])
                ranking = rank(scores)
                rows.append({
                    "question_id": q.id,
                    "readout": readout,
                    "variant": variant,
                    "normalisation": readout.rpartition(":")[2] if ":" in readout else "sum",
                    "scores": scores.tolist(),
                    "n_tokens": lengths.tolist(),
                    "ranking": ranking,
                    "gold_index": gold,
                    "gold_rank": ranking.index(gold),
                    "gold_first": ranking[0] == gold,
                })
    return rows


def rank(scores: Sequence[float]) -> list[int]:
    """Option indices, best score first (ties: the earlier option first)."""
    return [int(i) for i in np.argsort(-np.asarray(scores, dtype=float), kind="stable")]


def gold_first(recognition: Sequence[dict[str, Any]], readout: str) -> set[str]:
    """Question ids whose gold option ranks first under `readout`."""
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
    return {r["question_id"] for r in recognition if r["readout"] == readout and r["gold_first"]}


# -- the cell-level failure screen --------------------------------------------------


@dataclass(frozen=True)
class FailureCriterion:
    """When a cell (model x task) counts as a recognised-but-not-generated failure:
    recognition is above chance (the Wilson interval at `level` of its excess over
    chance lies above 0), its recognition score exceeds its generation score by at
    least `margin`, AND the paired (Newcombe) interval at `level` of that difference
    lies above 0. Both scores are accuracies on the same questions, so the difference
    is a paired one."""

    margin: float = 0.10
    level: float = 0.95
    #: off only to exercise the machinery on random-weight models (recognition at chance)
    above_chance: bool = True

    def describe(self) -> str:
        chance = (f"recognition's excess over chance (1 / number of options) has its {self.level:.0%} Wilson interval "
                  f"above 0, " if self.above_chance else "recognition NOT required above chance, ")
        return (f"{chance}recognition score - generation score >= {self.margin:g}, and the {self.level:.0%} paired "
                f"(Newcombe) interval of that difference lies above 0")


def recognition_chance(n_options: Sequence[int]) -> list[float]:
    """Per question (by its option count), the chance a guesser ranks the gold option
    first: 1 / options."""
    return [1.0 / n for n in n_options]


def screen_cell(recognised: Sequence[bool], generated: Sequence[bool], chance: Sequence[float],
                criterion: FailureCriterion = FailureCriterion()) -> dict[str, Any]:
    """One cell of the screen from its per-question outcomes (same questions, same
    order) and each question's recognition chance (`recognition_chance`): recognition
    score (gold option ranked first), its chance and excess over chance (Wilson interval
    of the score, less chance), the share of recognitions a guessing mixture would
    explain as lucky, the generation score (deployed answer graded right), their
    difference with its paired interval, how many questions are recognised but answered
    wrong, and whether the criterion holds."""
    rec, gen, c = np.asarray(recognised, bool), np.asarray(generated, bool), np.asarray(chance, float)
    if rec.shape != gen.shape or rec.shape != c.shape or rec.size == 0:
        raise ValueError(f"a cell needs equally many recognition, generation and chance values (> 0), got "
                         f"{rec.size}, {gen.size} and {c.size}")
    lo, hi = paired_diff_ci(gen, rec, level=criterion.level)
    diff = float(rec.mean() - gen.mean())
    chance_rate = float(c.mean())
    r_lo, r_hi = wilson_interval(int(rec.sum()), int(rec.size), criterion.level)
    excess = float(rec.mean()) - chance_rate
    # guessing mixture: a share k is known, the rest guessed, so r = k + (1 - k) c
    known = max(0.0, excess / (1 - chance_rate)) if chance_rate < 1 else 0.0
    return {
        "n_questions": int(rec.size),
        "recognition_score": float(rec.mean()), "generation_score": float(gen.mean()),
        "recognition_chance": chance_rate, "recognition_excess": excess,
        "recognition_excess_ci": [r_lo - chance_rate, r_hi - chance_rate],
        "recognition_known_share": known,
        # capped: below chance, every recognition is as many as a guesser's
        "lucky_share_of_recognised": min(1.0, (1 - known) * chance_rate / float(rec.mean())) if rec.any() else float("nan"),
        "difference": diff, "difference_ci": [float(lo), float(hi)],
        "n_recognised_not_generated": int((rec & ~gen).sum()),
        "failure": bool((r_lo - chance_rate > 0 or not criterion.above_chance) and diff >= criterion.margin and lo > 0),
    }
