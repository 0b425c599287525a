"""Failure localisation that rules out letter bias, chance recognition and scale: the
circular protocol, the letter-bias rule, the stratified split, power, steering in RMS
units, the recognition delimiter, on tiny models built to have a known answer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
import typer
from typer.testing import CliRunner

from rnr_interp.analyses.localise.circular import answer_from_records, circular_outcomes, circular_rows, letter_bias, shifted
from rnr_interp.analyses.localise.cohort import Split
from rnr_interp.engine.rows import Row
from rnr_interp.commands.localise import failures as failures_command
from rnr_interp.engine.generate import generate
from rnr_interp.metrics import REPAIR_EFFECT, wilson_power
from rnr_interp.models import LoadedModel, load_model
from rnr_interp.analyses.localise.recognition import TARGET_DELIMITER, option_sequences, recognize
from rnr_interp.analyses.localise.repair import run_failures, run_repair
from rnr_interp.engine.sampling import deployed_decoding, prompt_ids
from rnr_interp.analyses.localise.steering import run_steer
from rnr_interp.tasks import LETTERS, load_task, rotate_options
from rnr_interp.tasks.base import Question
from rnr_interp.tasks.synthetic import ArithmeticMC
from test_repair import parity_task


# -- the circular protocol ----------------------------------------------------------------


def test_circular_outcomes_tell_content_from_letter():
    """Right under every shift only for an answerer that follows the gold option's
    content; an always-"A" answerer is letter-locked and right under no more than one."""
    qs = load_task("arithmetic_mc", n=8).questions
    follows = circular_outcomes(qs, lambda asked: [(q.answer, True) for q in asked])
    assert all(o.correct and not o.letter_locked for o in follows.values())
    assert all(len(o.answers) == len(q.choices) for q, o in zip(qs, follows.values()))
    always_a = circular_outcomes(qs, lambda asked: [("A", q.answer == "A") for q in asked])
    assert all(o.letter_locked and not o.correct and sum(o.right) == 1 for o in always_a.values())
    # the rows the protocol asks: each question under every shift, labelled by the shift
    rows = circular_rows([Row(q, (), "deployed") for q in qs[:2]])
    assert [r.probe for r in rows[:4]] == ["deployed", "rotated:1:deployed", "rotated:2:deployed", "rotated:3:deployed"]
    assert rows[2].question == rotate_options(qs[0], 2) and shifted(qs[0], 0) is qs[0]
    # read back from stored records, the same definition
    records = pd.DataFrame([{"question_id": r.question.id, "probe": r.probe, "extracted": r.question.answer,
                             "correct": True} for r in rows])
    assert all(o.correct for o in circular_outcomes(qs[:2], answer_from_records(records, "deployed")).values())


def test_letter_bias_rule_plain_and_circular():
    qs = load_task("arithmetic_mc", n=40).questions
    answers_a = {q.id: "A" for q in qs}
    correct_a = {q.id: q.answer == "A" for q in qs}
    plain = letter_bias(qs, correct_a, answers_a)
    assert plain["explained"] and "letter distribution" in plain["message"] and plain["modal_share"] == 1.0
    # an answerer that follows content misses far fewer than a content-blind one would
    answers_gold = {q.id: q.answer for q in qs}
    wrong_two = {q.id: i >= 2 for i, q in enumerate(qs)}
    content = letter_bias(qs, {q.id: not wrong_two[q.id] or i > 5 for i, q in enumerate(qs)}, answers_gold)
    assert not content["explained"] and content["message"] is None
    outcomes = circular_outcomes(qs, lambda asked: [("A", q.answer == "A") for q in asked])
    circ = letter_bias(qs, {q.id: outcomes[q.id].correct for q in qs}, answers_a, outcomes)
    assert circ["explained"] and circ["n_letter_locked"] == len(qs) and "--circular" not in circ["message"]


def always_a_model() -> LoadedModel:
    """tiny-llama whose every next token is "A": a large constant direction d added to
    every token embedding dominates the residual stream, and the unembedding row of "A"
    reads d."""
    lm = load_model("tiny-llama:2")
    m = lm.hf_model
    d = torch.nn.functional.normalize(torch.randn(m.config.hidden_size, generator=torch.Generator().manual_seed(0)), dim=0)
    a = lm.tokenizer.convert_tokens_to_ids("A")
    with torch.no_grad():
        m.model.embed_tokens.weight.add_(50 * d)
        m.lm_head.weight[a].add_(10 * d)
    return lm


def test_always_a_model_has_an_empty_circular_failure_set_and_a_warning(tmp_path):
    lm = always_a_model()
    task = load_task("arithmetic_mc", n=24)
    decoding = deployed_decoding(task, 1)  # "A" (a longer "AA..." is no letter answer)
    plain = run_failures(lm, task, tmp_path / "plain", decoding=decoding, progress=False)
    assert plain.n_recognised > 0 and plain.n_failure > 0  # the plain failure set: the gold != A questions
    assert plain.letter_bias["explained"] and plain.letter_bias["message"]
    circ = run_failures(lm, task, tmp_path / "circular", decoding=decoding, progress=False, circular=True)
    assert circ.n_recognised == plain.n_recognised and circ.n_failure == 0 and circ.n_panel == 0
    assert circ.letter_bias["explained"] and circ.circular["n_letter_locked"] > 0
    assert "letter-locked" in circ.failure_empty_reason
    assert circ.screen["generation_score"] == 0.0 and circ.screen["circular"]


def test_failures_command_prints_the_letter_warning_with_its_rule(tmp_path, monkeypatch):
    import rnr_interp.models as models

    monkeypatch.setattr(models, "load_model", lambda spec, **kw: always_a_model())
    app = typer.Typer()
    app.command("failures")(failures_command)
    app.command("noop")(lambda: None)
    res = CliRunner().invoke(app, ["failures", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "12",
                                   "--max-new-tokens", "1", "--circular", "--out", str(tmp_path / "f"), "--quiet"])
    assert res.exit_code == 0, res.output
    assert "WARNING: the failure set is explained by the deployed letter distribution" in res.output
    assert "rule: explained by the deployed letter distribution when at least 50%" in res.output


def test_circular_refuses_word_graded_tasks_and_the_letter_readout(tmp_path):
    from rnr_interp.tasks import BoolQ

    lm = load_model("tiny-llama:2")
    boolq = BoolQ([Question(id="b0", text="Is it?", answer="yes", choices=("yes", "no"), gold_index=0, context="It is.")])
    with pytest.raises(ValueError, match="circular protocol shifts lettered options"):
        run_failures(lm, boolq, tmp_path / "b", circular=True, progress=False)
    with pytest.raises(ValueError, match="letter readout"):
        run_failures(lm, load_task("arithmetic_mc", n=4), tmp_path / "l", readout="letter", circular=True, progress=False)
    assert not (tmp_path / "b").exists() and not (tmp_path / "l").exists()


# -- the split -----------------------------------------------------------------------------


def test_split_is_stratified_by_gold_option_and_subset():
    qs = load_task("arithmetic_mc", n=60).questions
    # a set where every "A" question would hash into one half is impossible: each gold letter splits evenly
    for seed in range(5):
        sel, out = Split(seed=seed)(qs)
        for letter in set(q.answer for q in qs):
            n_sel = sum(q.answer == letter for q in sel)
            n_out = sum(q.answer == letter for q in out)
            assert abs(n_sel - n_out) <= 1
        assert len(sel) == 30 and not {q.id for q in sel} & {q.id for q in out}
    assert Split().stratified_by(qs) == ["gold option"]
    tagged = [dataclasses.replace(q, meta={**q.meta, "subject": "s" + str(i % 3)}) for i, q in enumerate(qs)]
    sel, out = Split()(tagged)
    strata = {(q.answer, q.meta["subject"]) for q in tagged}
    assert all(abs(sum((q.answer, q.meta["subject"]) == s for q in sel) - sum((q.answer, q.meta["subject"]) == s for q in out)) <= 1
               for s in strata)
    assert Split().stratified_by(tagged) == ["gold option", "task subset (meta 'subject')"]


# -- power -----------------------------------------------------------------------------------


def test_power_is_the_probability_the_findings_rule_passes():
    from scipy import stats

    from rnr_interp.metrics import wilson_interval

    for n in (5, 20, 61):
        passing = [k for k in range(n + 1) if wilson_interval(k, n)[0] >= REPAIR_EFFECT.threshold]
        assert wilson_power(REPAIR_EFFECT, n) == pytest.approx(stats.binom.pmf(passing, n, 0.676).sum())
    assert wilson_power(REPAIR_EFFECT, 10) < 0.8 <= wilson_power(REPAIR_EFFECT, 60)


class FirstCharMC(ArithmeticMC):
    """Graded right when the generation's first character is `meta["target"]` (what the
    unbroken model says first), so a planted break is a wrong answer and removing it is
    a repair."""

    name = "first_char_mc"

    def extract(self, generation):
        return generation[:1] or None

    def grade(self, extracted, q):
        return extracted is not None and extracted == q.meta["target"]


def planted_model_and_task(n_questions: int) -> tuple[LoadedModel, FirstCharMC, int]:
    """tiny-llama:3 whose MLP 1 is the break: the unbroken model is the same with MLP 1
    silenced, so silencing it restores every answer exactly. Each question's gold option
    is the broken model's own greedy reply to the bare question (recognition ranks it
    first); the target is the unbroken model's first character on the deployed prompt.
    Kept: questions recognised by the broken model whose unbroken reply has a first
    character."""
    lm = load_model("tiny-llama:3")
    broken_layer = 1
    with torch.no_grad():
        lm.hf_model.model.layers[broken_layer].mlp.down_proj.weight.mul_(3.0)
    base = load_task("arithmetic_mc", n=n_questions, seed=3)
    from rnr_interp.interventions import Ablate

    rng = np.random.default_rng(0)
    staged = []
    contexts = [lm.encode(lm.render(base.recognition_prompt(q))) for q in base.questions]
    replies = generate(lm, contexts, n=1, decoding=deployed_decoding(base, 4))
    for q, reply in zip(base.questions, replies):
        gold_text = reply[0].text.strip() or "x"
        others = ["".join(rng.choice(list("qwzjkvx"), size=4)) for _ in range(3)]
        gold = int(rng.integers(0, 4))
        choices = others[:gold] + [gold_text] + others[gold:]
        staged.append(dataclasses.replace(q, choices=tuple(choices), gold_index=gold, answer=LETTERS[gold]))
    task = FirstCharMC(staged, source="test")
    decoding = deployed_decoding(task, 1)
    clean = generate(lm, [prompt_ids(lm, task, q) for q in staged], n=1, decoding=decoding,
                     interventions=[[Ablate("mlp", broken_layer)]] * len(staged))
    staged = [dataclasses.replace(q, meta={**q.meta, "target": g[0].text[:1]}) for q, g in zip(staged, clean)]
    recognised = {r["question_id"] for r in recognize(lm, task, staged, variants=("option",))
                  if r["readout"] == "option:mean" and r["gold_first"]}
    # an unbroken reply that stops at once has no first character to grade
    return lm, FirstCharMC([q for q in staged if q.id in recognised and q.meta["target"]], source="test"), broken_layer


def test_a_planted_repair_is_found_repaired_and_reported_with_power(tmp_path):
    lm, task, broken = planted_model_and_task(400)
    s = run_repair(lm, task, tmp_path / "repair", decoding=deployed_decoding(task, 1), sweep="mlp", panel=None,
                   progress=False, batch_size=64)
    assert s.chosen["layer"] == broken
    at = s.at_chosen_layer["mlp"]
    assert at["repair"]["rate"] == 1.0 and at["damage"]["rate"] == 0.0
    assert at["repair"]["n"] >= 60 and at["repair"]["power"] >= 0.8 and at["repair"]["power_test"]["testable"]
    assert at["repair"]["selection"]["rate"] == 1.0 and at["repair"]["all"]["rate"] == 1.0
    assert s.split["stratified_by"] == ["gold option"]
    assert "recognition_chance" in s.screen and len(s.screen["recognition_excess_ci"]) == 2


# -- steering scale ----------------------------------------------------------------------------


def scaled_copy(c: float) -> LoadedModel:
    """tiny-llama:2 with its residual stream multiplied by c: the embeddings and every
    block's writes (attention output and MLP down projections) scaled; RMSNorm reads
    the stream up to scale, so the model computes the same function."""
    lm = load_model("tiny-llama:2")
    with torch.no_grad():
        m = lm.hf_model.model
        m.embed_tokens.weight.mul_(c)
        for block in m.layers:
            block.self_attn.o_proj.weight.mul_(c)
            block.mlp.down_proj.weight.mul_(c)
    return lm


@pytest.mark.parametrize("unit", ["rms", "write"])
def test_steering_in_rms_and_write_units_is_invariant_to_the_residual_scale(tmp_path, unit):
    task = parity_task(48)
    decoding = deployed_decoding(task, 2)
    alphas = (0.0, 0.5, 1.0, 2.0)
    runs = {c: run_steer(scaled_copy(c), task, tmp_path / f"x{c:g}", layer=0, alphas=alphas, alpha_unit=unit,
                         decoding=decoding, progress=False) for c in (1.0, 8.0)}
    one, eight = runs[1.0], runs[8.0]
    assert one.alpha_unit == unit and eight.residual_rms == pytest.approx(8 * one.residual_rms, rel=1e-3)
    scale = one.residual_rms if unit == "rms" else one.write_rms
    assert one.steered_norm_per_alpha == pytest.approx(scale, rel=1e-5)
    assert (one.write_rms is None) == (unit == "rms")
    assert eight.v_norm == pytest.approx(8 * one.v_norm, rel=1e-3)
    rates = {c: [(r["alpha"], r["direction"], r["k"], r["n"]) for r in s.table] for c, s in runs.items()}
    assert rates[1.0] == rates[8.0]
    assert any(k > 0 for a, _, k, _ in rates[1.0] if a > 0)  # the steering moved answers: not a vacuous match


# -- recognition formatting without a chat template ---------------------------------------------


def _base_model(tokenizer) -> LoadedModel:
    return LoadedModel(spec="base-tokenizer", bridge=None, tokenizer=tokenizer, stop_token_ids=(), chat=False)


@pytest.mark.parametrize("which", ["char", "bpe"])
def test_recognition_without_a_chat_template_scores_exactly_the_option_after_a_space(which):
    if which == "char":
        lm = load_model("tiny-gpt2:1")
        assert not lm.chat
    else:
        from transformers import AutoTokenizer

        from rnr_interp.models import smollm2_dir

        try:
            lm = _base_model(AutoTokenizer.from_pretrained(smollm2_dir(), local_files_only=True))
        except Exception as exc:  # no cached demo model and no network
            pytest.skip(f"SmolLM2's tokenizer is not available: {exc}")
    task = load_task("arithmetic_mc", n=3)
    for q in task.questions:
        for seq, option in zip(option_sequences(lm, task, q, "option"), q.choices):
            text = lm.render(task.recognition_prompt(q)).rstrip()
            assert lm.tokenizer.decode(list(seq.continuation)) == TARGET_DELIMITER + option.strip()
            assert list(seq.continuation) == lm.tokenizer(" " + option.strip(), add_special_tokens=False).input_ids
            # joined and split tokenize alike: the scored tokens are the option's, none borrowed from the question
            assert list(seq.context) + list(seq.continuation) == lm.encode(text + " " + option.strip())
    chat = load_model("tiny-llama:2")
    seq = option_sequences(chat, task, task.questions[0], "option")[0]
    assert chat.tokenizer.decode(list(seq.continuation)) == task.questions[0].choices[0].strip()  # a chat turn: no space


# -- circular rows through the analyses, and the units' permutation control ---------------------


def test_outcome_counts_under_circular_need_every_shift():
    from rnr_interp.analyses.localise.readings import outcome_counts

    qs = load_task("arithmetic_mc", n=2).questions
    rows = circular_rows([Row(q, (), "ablate:mlp:0") for q in qs])
    # q0 right under every shift; q1 wrong under shift 2 only
    wrong = {(qs[1].id, "rotated:2:ablate:mlp:0")}
    records = pd.DataFrame([{"question_id": r.question.id, "probe": r.probe, "extracted": r.question.answer,
                             "correct": (r.question.id, r.probe) not in wrong} for r in rows])
    assert outcome_counts(records, qs, "ablate:mlp:0") == (2, 2)  # unshifted: both right
    assert outcome_counts(records, qs, "ablate:mlp:0", circular=True) == (1, 2)


def test_a_circular_repair_asks_every_row_under_every_shift(tmp_path):
    from test_repair import letter_hash_task

    lm = load_model("tiny-llama:2")
    task = letter_hash_task(12)
    s = run_repair(lm, task, tmp_path / "r", layers=[0], sweep="mlp", decoding=deployed_decoding(task, 3), circular=True,
                   progress=False)
    from rnr_interp.records import RunDir

    run = RunDir(tmp_path / "r")
    records = run.read_records()
    n_shifts = len(task.questions[0].choices)
    counts = records.groupby("probe").size()
    assert counts["deployed"] == counts["rotated:3:deployed"] == len(task.questions)
    asked = {*run.read_json("failure_set")["question_ids"], *run.read_json("healthy_panel")["question_ids"]}
    assert n_shifts == 4 and len(asked) > 0
    assert counts.get("ablate:mlp:0", 0) == counts.get("rotated:3:ablate:mlp:0", 0) == len(asked)
    generation = run.read_table("generation").set_index("question_id")
    for q in task.questions:  # the cohort's reading is the records' all-shifts reading
        mine = records[records["question_id"] == q.id]
        right = mine[mine["probe"].isin(["deployed", "rotated:1:deployed", "rotated:2:deployed", "rotated:3:deployed"])]
        assert generation.loc[q.id, "correct"] == bool(right["correct"].all())
    assert s.circular["on"] and s.screen["circular"] and run.config["circular"] is True


def test_units_permutation_control_rescores_the_block_and_every_top_k(tmp_path):
    from test_repair import letter_hash_task

    from rnr_interp.analyses.localise.steering import run_units

    lm = load_model("tiny-llama:2")
    task = letter_hash_task(40)
    s = run_units(lm, task, tmp_path / "u", layer=1, ks=(1, 4), draws=2, panel=8, decoding=deployed_decoding(task, 3),
                  permutation_control=True, progress=False)
    assert s.skipped is None, s.skipped
    control = s.permutation_control
    assert set(control["probes"]) == {"ablate:mlp:1", "units:top:1", "units:top:4"}
    from rnr_interp.records import RunDir

    held = RunDir(tmp_path / "u").read_json("failure_set")["heldout_ids"]
    assert control["n"] == len(held) > 0


def test_the_report_page_carries_the_letter_warning_and_chance(tmp_path):
    from rnr_interp.records import RunDir
    from rnr_interp.report.html import build_page

    task = load_task("arithmetic_mc", n=12)
    run_failures(always_a_model(), task, tmp_path / "f", decoding=deployed_decoding(task, 1), progress=False, circular=True)
    page, _ = build_page(RunDir(tmp_path / "f"))
    assert "warning: the failure set is explained by the deployed letter distribution" in page
    assert "recognition over chance (1 / options)" in page and "split stratified by" in page
