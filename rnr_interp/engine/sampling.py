"""Deployed and probe candidates for a task, graded, as records.

For each question, one prefill feeds the deployed candidate (greedy unless configured)
and the K probe samples (`generate` fans the prompt's KV cache out to 1 + K rows).
Questions are processed in fixed chunks of `batch_size` in task order and each chunk is
written as one atomic records part, so a killed run resumes at a chunk boundary and
produces exactly the records an uninterrupted run would.

Also the one place that knows which engine serves a backend ("tl": the bridge engine,
hooks and all; "vllm": plain sampling, no hooks), and `run_config`, the fields every
analysis's run folder config starts with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from tqdm.auto import tqdm

from rnr_interp.engine.decoding import BACKENDS, SAMPLING_TEMPERATURE, Decoding, Engine, Generation, check_hooks

from rnr_interp.engine.generate import generate
from rnr_interp.grading import graded_answers
from rnr_interp.interventions import Intervention, set_id
from rnr_interp.metrics import DEPLOYED, chance_baselines, vote_table_bytes
from rnr_interp.models import LoadedModel, PromptFormat, machine_memory
from rnr_interp.records import DEFAULT_GRADING, stable_key
from rnr_interp.tasks.base import Question, Task
from rnr_interp.tasks.templates import render_each

if TYPE_CHECKING:  # the vLLM backend imports vllm lazily; only its type is named here
    from rnr_interp.engine.vllm_backend import VLLMModel


@dataclass(frozen=True)
class Probe:
    """K temperature samples per question. `name` labels the records' `probe` column."""

    k: int = 32
    temperature: float = SAMPLING_TEMPERATURE
    top_p: float = 1.0
    seed: int = 0
    name: str = "temperature"

    def __post_init__(self):
        # O_K needs at least one sample; NaN fails every comparison, hence `not ... > 0`.
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k must be a whole number >= 1 (the probe budget), got {self.k}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a number > 0 for a sampling probe (greedy samples would all be equal), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def candidate_seed(seed: int, question_id: str, candidate: int) -> int:
    """A stable 63-bit seed per (run seed, question, candidate): the same candidate
    gets the same randomness whatever batch it lands in."""
    return stable_key(seed, question_id, candidate)


def ask_as_the_task_says(lm: LoadedModel, task: Task) -> None:
    """Set `lm`'s prompt format for a task that asks its prompt raw (`raw_prompt`: an
    lm-eval task without `apply_chat_template`): the text as it is, no chat template,
    with the special tokens the tokenizer itself adds (a BOS or none), as lm-eval's
    Hugging Face model asks. Other tasks leave the model's own format."""
    if getattr(task, "raw_prompt", False):
        bos = lm.tokenizer.bos_token_id
        lm.prompt_override = PromptFormat("", "", add_bos=bos is not None and lm.tokenizer("a").input_ids[:1] == [bos])


def prompt_ids(lm: LoadedModel, task: Task, q: Question) -> list[int]:
    return lm.encode(lm.render(task.user_message(q)))


def run_config(kind: str, lm: LoadedModel, task: Task, grading: str | None = None, save_logprobs: bool = False,
               **extra: Any) -> dict[str, Any]:
    """What decides a run's records, common part: a run folder resumes only with the
    same config, and two runs are comparable only when model, task and question ids
    agree. Each analysis adds its own settings as `extra`. `grading` is the headline
    grading (records.GRADINGS); None: the folder's own when resuming, else the default
    (`RunDir.create` settles it, and `RunDir.grading` says which). `save_logprobs`: the
    records hold each candidate's token ids and log-probs (records.TOKEN_COLUMNS); only
    then is it in the config, so a run without them keeps the config (and run id) it had."""
    return {"kind": kind, "model": lm.spec, "model_facts": lm.facts(), "task": task.run_description(),
            "question_ids_hash": task.ids_hash(), "grading": grading, **extra,
            **({"save_logprobs": True} if save_logprobs else {})}


def generator(lm: LoadedModel | VLLMModel, backend: str | None, interventions: Sequence[Intervention] = ()) -> Engine:
    """The engine of a sampling backend: "tl" (TransformerLens, the default, hooks and
    all) or "vllm" (plain sampling, `lm` from `vllm_backend.load_vllm`)."""
    backend = backend or getattr(lm, "backend", "tl")
    if backend not in BACKENDS:
        raise ValueError(f"unknown sampling backend {backend!r}; known: {', '.join(BACKENDS)}")
    if backend != getattr(lm, "backend", "tl"):
        raise ValueError(f"backend {backend!r} needs a model loaded for it (this one is for {getattr(lm, 'backend', 'tl')!r})")
    check_hooks(backend, interventions)
    if backend == "tl":
        return generate
    from rnr_interp.engine.vllm_backend import generate as vllm_generate

    return vllm_generate


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def candidate_row(task: Task, q: Question, g: Generation, /, grading: str, tokens: bool = False, **fields) -> dict[str, Any]:
    """One record of a generation, graded both ways; `correct` is the `grading` one (the
    run's); with `tokens`, its token ids and log-probs too (`RunDir.saves_tokens`)."""
    # `extracted` is None unless the generation holds a valid answer of the task's kind
    # for q: the records' unparsed rate (metrics.unparsed_rate) counts exactly these.
    grade = task.grade_candidate(g.text, q, g.finish)
    return {
        **fields,
        "question_id": q.id,
        "text": g.text,
        "extracted": grade.extracted,
        "gold": q.answer,
        "correct": grade.strict if grading == "strict" else grade.flexible,
        "correct_strict": grade.strict,
        "correct_flexible": grade.flexible,
        "logprob": float(g.logprob),
        "n_tokens": g.n_tokens,
        "finish": g.finish,
        **({"token_ids": list(g.tokens), "token_logprobs": [float(x) for x in g.token_logprobs]} if tokens else {}),
    }


def sample_questions(
    lm: LoadedModel | VLLMModel,
    task: Task,
    questions: Sequence[Question],
    *,
    probe: Probe,
    deployed: Decoding,
    interventions: Sequence[Intervention] = (),
    run_id: str = "",
    backend: str | None = None,
    grading: str = DEFAULT_GRADING,
    deployed_label: str = DEPLOYED,
    tokens: bool = False,
) -> list[dict[str, Any]]:
    """Records for one batch of questions: the deployed candidate and K probe samples each.
    `backend` ("tl" or "vllm") defaults to the one `lm` was loaded for; `grading` is
    the run's (`RunDir.grading`), the one its records' `correct` holds; `deployed_label`
    labels the deployed rows (a rotated control's `rotated:SHIFT:deployed`); `tokens`: the
    rows hold the token columns (`candidate_row`)."""
    engine = generator(lm, backend, interventions)
    max_new = deployed.max_new_tokens
    prompts = [prompt_ids(lm, task, q) for q in questions]
    n = 1 + probe.k
    # Column 0 is the deployed candidate (seed index -1); columns 1..K the probe samples.
    seeds = [[candidate_seed(probe.seed, q.id, j - 1) for j in range(n)] for q in questions]
    sample = Decoding(temperature=probe.temperature, top_p=probe.top_p, max_new_tokens=max_new)
    gens = engine(
        lm, prompts, n=n,
        columns=[deployed] + [sample] * probe.k,  # each candidate with the decoding its manifest entry states
        seeds=seeds,
        interventions=list(interventions),
        stop_strings=task.stop_strings,
    )
    common = {"run_id": run_id, "model": lm.spec, "task": task.name, "intervention": set_id(interventions)}
    rows = []
    for q, q_seeds, q_gens in zip(questions, seeds, gens):
        for j, g in enumerate(q_gens):
            probe_name, cand = (deployed_label, 0) if j == 0 else (probe.name, j - 1)
            rows.append(candidate_row(task, q, g, grading, tokens, **common, probe=probe_name, candidate=cand,
                                      seed=q_seeds[j]))
    return rows


def sample_task(
    lm: LoadedModel | VLLMModel,
    task: Task,
    *,
    probe: Probe,
    deployed: Decoding,
    run=None,
    interventions: Sequence[Intervention] = (),
    batch_size: int = 8,
    run_id: str = "",
    progress: bool = True,
    backend: str | None = None,
    deployed_label: str = DEPLOYED,
) -> list[dict[str, Any]]:
    """Sample every question of `task` not already in `run` (a `RunDir`) with both
    labels (`deployed_label`, `probe.name`), writing each chunk as it completes, graded
    with the run's grading (the default without a run). Returns the rows produced by
    this call."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batches = list(chunks(task.questions, batch_size))
    done = run.done_question_ids({deployed_label, probe.name}) if run is not None else set()
    produced: list[dict[str, Any]] = []
    bar = tqdm(total=len(task.questions), unit="q", desc=f"{task.name} K={probe.k}", disable=not progress)
    with bar:
        for batch in batches:
            todo = [q for q in batch if q.id not in done]
            if len(todo) < len(batch):
                bar.update(len(batch) - len(todo))
            if not todo:
                continue
            rows = sample_questions(lm, task, todo, probe=probe, deployed=deployed, interventions=interventions,
                                    run_id=run_id, backend=backend,
                                    grading=run.grading if run is not None else DEFAULT_GRADING,
                                    deployed_label=deployed_label, tokens=run is not None and run.saves_tokens)
            if run is not None:
                run.write_question_batch(rows)
            produced.extend(rows)
            bar.update(len(todo))
    return produced


def check_prompts_fit(lm: LoadedModel, task: Task, max_new_tokens: int) -> int:
    """Refuse, before anything runs, a task with a question whose prompt plus
    `max_new_tokens` would not fit in the model's context (the engine checks again
    before every model call; this names the question up front). Returns the longest
    prompt's token count. The prompts render first in a bounded child
    (`templates.render_each`): a checkpoint's chat template is its author's code, and
    one that loops or grows without end is refused in one line."""
    rendered = render_each(lambda q: lm.render(task.user_message(q)), task.questions, f"the chat template of {lm.spec}")
    longest = 0
    for q, prompt in zip(task.questions, rendered):
        n = len(lm.encode(prompt))
        lm.check_fits(n + max_new_tokens, f"question {q.id!r} ({n} prompt tokens + {max_new_tokens} new)")
        longest = max(longest, n)
    return longest


#: what one record row costs in memory once read back (`RunDir.read_records`: an Arrow
#: table and its DataFrame), besides its text: about four characters a token
RECORD_ROW_BYTES = 1000
#: the share of the machine's memory a run may plan to use (the model and Python need the rest)
MEMORY_SHARE = 0.8


def generation_row_bytes(lm: LoadedModel, positions: int) -> int:
    """Memory of one row being generated on `lm` up to `positions` tokens: its keys and
    values in every layer (`generate`'s cache buffers) and a few copies of its logits."""
    import torch

    facts = lm.facts()
    itemsize = torch.empty((), dtype=getattr(torch, facts["dtype"])).element_size()
    kv = 2 * facts["n_layers"] * facts["n_kv_heads"] * facts["d_head"] * itemsize
    return kv * positions + 3 * 4 * facts["d_vocab"]


def device_memory(lm: LoadedModel) -> int:
    """Memory of the device `lm` runs on (a GPU's own, else the machine's)."""
    import torch

    if lm.device.type == "cuda":
        return torch.cuda.get_device_properties(lm.device).total_memory
    return machine_memory()


@dataclass(frozen=True)
class RunSize:
    """What a run will hold in memory, as a function of its budget `votes` (K, or a
    route budget): the records of `n_questions` questions, `fixed_rows + rows_per_vote *
    votes` rows each, read back to summarise; the answer-blind vote tables over `votes`
    candidates per question (`metrics.vote_table_bytes`); and, once the model is known
    (`row_bytes` > 0), the `batch_rows[0] + batch_rows[1] * votes` rows one batched
    generation holds, `row_bytes` each, on the model's device (`device_bytes`)."""

    n_questions: int
    votes: int
    fixed_rows: int
    rows_per_vote: int
    max_new_tokens: int
    #: distinct answers a question can have (None: free-form, up to one per candidate)
    n_answers: int | None = None
    batch_rows: tuple[int, int] = (0, 0)
    row_bytes: int = 0
    #: the model's device memory, when it is not the machine's (a GPU)
    device_bytes: int | None = None

    def parts(self, votes: int | None = None, n_questions: int | None = None) -> tuple[int, int, int]:
        """(vote table bytes, records bytes, generation bytes), at other `votes` or
        `n_questions` when given."""
        v = self.votes if votes is None else votes
        q = self.n_questions if n_questions is None else n_questions
        row = RECORD_ROW_BYTES + 4 * self.max_new_tokens
        generation = (self.batch_rows[0] + self.batch_rows[1] * v) * self.row_bytes
        return vote_table_bytes(v, self.n_answers), q * (self.fixed_rows + self.rows_per_vote * v) * row, generation

    def fits(self, usable: int, usable_device: int, votes: int | None = None) -> bool:
        votes_bytes, records, generation = self.parts(votes)
        if self.device_bytes is None:
            return votes_bytes + records + generation <= usable
        return votes_bytes + records <= usable and generation <= usable_device


def check_run_size(size: RunSize, option: str, memory: int | None = None) -> None:
    """Refuse (ValueError) a run whose vote tables, records and batched generations will
    not fit in MEMORY_SHARE of `memory` (default: `machine_memory()`), before anything
    runs: such a run would sample for hours and then fail, on every rerun. The message
    says how much it needs and the largest `option` (the budget: --k, or --budget) and
    the largest --n that fit."""
    usable = int(MEMORY_SHARE * (machine_memory() if memory is None else memory))
    usable_device = int(MEMORY_SHARE * size.device_bytes) if size.device_bytes is not None else usable
    if size.fits(usable, usable_device):
        return
    low, high = 0, size.votes  # the largest budget that fits, by bisection (need grows with it)
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if size.fits(usable, usable_device, mid) else (low, mid - 1)
    votes, records, generation = size.parts()
    # only the records grow with the questions
    fixed = votes + (generation if size.device_bytes is None else 0)
    device_fits = size.device_bytes is None or generation <= usable_device
    most_questions = (usable - fixed) // size.parts(n_questions=1)[1] if fixed < usable and device_fits else 0
    gib = 2 ** 30
    ways = [f"the largest {option} that fits is {low}" if low else f"no {option} fits"]
    if 0 < most_questions < size.n_questions:
        ways.append(f"the largest --n at this {option} is {most_questions}")
    if generation and low < size.votes:
        ways.append("a smaller --batch-size")
    where = f"{usable / gib:.1f} GiB this run may use ({MEMORY_SHARE:.0%} of the machine's)"
    if size.device_bytes is not None:
        where += f", {usable_device / gib:.1f} GiB on the model's device"
    raise ValueError(
        f"{size.n_questions} questions at {option} {size.votes} need about {(votes + records + generation) / gib:.1f} GiB "
        f"(answer-blind vote tables {votes / gib:.1f} GiB, records {records / gib:.1f} GiB"
        + (f", batched generation {generation / gib:.1f} GiB" if generation else "")
        + f"), more than the {where}; {', or '.join(ways)}")


def run_size(task: Task, votes: int, *, fixed_rows: int, rows_per_vote: int, max_new_tokens: int, batch_rows: tuple[int, int],
             generating: tuple[LoadedModel, int] | None = None) -> RunSize:
    """A run's `RunSize` over `task`; with `generating` (the loaded model and the longest
    prompt's token count), its batched generations too."""
    if generating is None:
        return RunSize(len(task), votes, fixed_rows, rows_per_vote, max_new_tokens, answer_count(task))
    lm, longest = generating
    return RunSize(len(task), votes, fixed_rows, rows_per_vote, max_new_tokens, answer_count(task), batch_rows,
                   generation_row_bytes(lm, longest + max_new_tokens), None if lm.device.type == "cpu" else device_memory(lm))


def answer_count(task: Task) -> int | None:
    """The most distinct answers a question of `task` can get (its options), or None
    when answers are free-form."""
    options = [task.options(q) for q in task.questions]
    return None if not options or any(o is None for o in options) else max(len(o) for o in options)


def deployed_decoding(task: Task, max_new_tokens: int | None = None, temperature: float = 0.0) -> Decoding:
    """The one deployed decoding of a task, for every command (audit, failures, repair,
    steer, units, sweeps, routing): greedy unless told otherwise, `task.max_new_tokens`
    new tokens unless overridden. Runs decoded differently are not comparable: the
    decoding is recorded in every manifest ("deployed") and cross-run views refuse a
    mismatch."""
    return Decoding(temperature=temperature, max_new_tokens=max_new_tokens or task.max_new_tokens)


def chance_summary(task: Task, records, k: int | None, grading: str) -> dict[str, Any] | None:
    """`metrics.chance_baselines` for the deployed rows of `records` (one per question of
    `task` present there), their answers read under `grading` (`grading.graded_answers`,
    as the audit's chance null reads them), or None when the task's answers are not a
    finite option set."""
    questions = {q.id: q for q in task.questions}
    dep = records[(records["probe"] == DEPLOYED) & records["question_id"].isin(list(questions))]
    asked = [questions[i] for i in dep["question_id"]]
    if not asked or any(task.options(q) is None for q in asked):
        return None
    answers = graded_answers(dep, task, grading)
    return chance_baselines(answers, [q.answer for q in asked], [task.options(q) for q in asked], k)
