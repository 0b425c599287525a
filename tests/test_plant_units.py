"""The units organism: k units added to one MLP that turn each answer starting with one
of k tokens to start with a rarer token none of them is. Reproducible from its seed, the base (to float
rounding) when its units are silenced or its strength is 0, content-dependent, and found by the ordinary
localisation commands."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from rnr_interp.analyses.organisms import PLANTED_FILE, WEIGHTS_FILE, NotPlantable, draw_layer, load_base, plant, read_planted
from rnr_interp.analyses.organisms.losable import LOSABLE_SHARE
from rnr_interp.cli import app
from rnr_interp.engine.rows import Row, generate_rows
from rnr_interp.engine.sampling import deployed_decoding
from rnr_interp.interventions import AblateUnits, applied, decoder_blocks
from rnr_interp.models import load_model
from tests.test_localise_freeform import echo_task
from tests.test_plant import logits

BASE = "tiny-llama:4"
# silenced, the units still widen the down projection: it sums its 128 + k products in another
# order than the base's 128 (the CPU's matmul kernel picks the blocking), so the logits agree
# to float32 rounding, bit for bit only on some kernels; every original weight is kept exactly
ROUNDING = 1e-5


def same_logits(a, b) -> bool:
    return float((a - b).abs().max()) <= ROUNDING


@pytest.fixture(scope="module")
def echo():
    return echo_task()


def answers(lm, task) -> list[str | None]:
    gens = generate_rows(lm, task, [Row(q, (), "deployed") for q in task.questions], deployed_decoding(task))
    return [task.extract(g.text) for g in gens]


def test_a_units_organism_is_reproducible_from_its_seed(tmp_path, echo):
    first = plant("units", BASE, tmp_path / "a", task=echo, seed=4)
    again = plant("units", BASE, tmp_path / "b", task=echo, seed=4)
    assert (tmp_path / "a" / WEIGHTS_FILE).read_bytes() == (tmp_path / "b" / WEIGHTS_FILE).read_bytes()
    assert first == again and first.task == "echo" and first.drawn["drawn_layer"] == draw_layer(4, 4)
    assert first.expected["units"] == {"layer": first.location["layer"], "units": [128, 129, 130]}  # appended after 128
    assert first.expected["repair"] == {"component": "mlp", "layers": [first.location["layer"]]}
    assert len(first.detail["direction"]) == 64 and abs(torch.tensor(first.detail["direction"]).norm() - 1) < 1e-5


def test_silencing_the_planted_units_or_strength_zero_gives_back_the_base(tmp_path, echo):
    planted = plant("units", BASE, tmp_path / "u", task=echo, layer=2, seed=0)
    organism, base = load_model(str(tmp_path / "u")), load_model(BASE)
    prompt = echo.user_message(echo.questions[0])
    assert not same_logits(logits(organism, prompt), logits(base, prompt))  # the units act at the answer start
    with applied(organism, [AblateUnits(2, planted.location["units"])]):
        assert same_logits(logits(organism, prompt), logits(base, prompt))
    null = plant("units", BASE, tmp_path / "u0", task=echo, layer=2, seed=0, strength=0.0)
    assert null.expected == {"effect": False}
    assert same_logits(logits(load_model(str(tmp_path / "u0")), prompt), logits(base, prompt))
    # every original weight is kept: the planted folder differs from the base only in the appended units
    theirs, ours = load_base(BASE)[0].state_dict(), load_base(str(tmp_path / "u"))[0].state_dict()
    grown = set()
    for name, weight in theirs.items():
        assert torch.equal(ours[name][tuple(slice(0, n) for n in weight.shape)], weight), name
        if ours[name].shape != weight.shape:
            grown.add(name)
            appended = ours[name].abs().sum() - weight.abs().sum()
            assert (appended > 0) == name.startswith("model.layers.2."), name  # zero units in the other blocks
    assert grown == {f"model.layers.{i}.mlp.{p}_proj.weight" for i in range(4) for p in ("gate", "up", "down")}


# tiny-olmo2: an RMSNorm after every MLP, which the units write before; its answers start with two tokens,
# so one unit leaves the other's questions alone; its read-out there misses the size asked by up to 7%,
# which the norm reads as up to 0.16 nats of lead
@pytest.mark.parametrize("spec,units,within", [(BASE, 3, 0.05), ("tiny-olmo2:4", 1, 0.2)])
def test_the_units_turn_each_answer_to_its_partner_token_and_leave_recognition_alone(tmp_path, spec, units, within):
    from rnr_interp.analyses.localise.recognition import gold_first, recognize
    from rnr_interp.analyses.organisms.units import UNITS_LEAD, lead_of

    echo = echo_task(spec)
    planted = plant("units", spec, tmp_path / "u", task=echo, layer=2, seed=0, units=units)
    base, organism = load_model(spec), load_model(str(tmp_path / "u"))
    before, after = answers(base, echo), answers(organism, echo)
    affected = set(planted.detail["affected_question_ids"])
    assert len(affected) >= 10 and set(planted.detail["unaffected_question_ids"]) and planted.strength == UNITS_LEAD
    tokens, partners = planted.detail["tokens"], planted.detail["partners"]
    # to tokens other answers start with, none of them a unit's own: v then raises no gold
    firsts = [q.answer[:1] for q in echo.questions]
    assert len(set(partners)) == units and set(partners) <= set(firsts) - set(tokens)  # (enough first tokens here)
    assert max(firsts.count(w) for w in partners) <= min(firsts.count(t) for t in tokens)
    for q, was, now in zip(echo.questions, before, after):
        assert was == q.answer  # the echo task's golds are the base's own answers
        if q.id in affected:  # content: the answer now starts with its unit's partner, not with a phrasing token
            assert (now or "")[:1] == partners[tokens.index(q.answer[:1])]
        else:
            assert now == q.answer
    # sized through the model: where each affected answer starts its partner leads every other token by the strength
    from rnr_interp.analyses.organisms import own_answers

    base_model, tokenizer = load_base(spec)
    planted_model = load_base(str(tmp_path / "u"))[0]
    ids, partner_ids = planted.detail["token_ids"], planted.detail["partner_token_ids"]
    leads = [lead_of(planted_model, 2, s.context, torch.zeros(len(planted.detail["direction"])), partner_ids[ids.index(s.answer[0])])
             for s in own_answers(base_model, tokenizer, echo) if s is not None and s.question.id in affected]
    assert len(leads) == len(affected) == len(planted.detail["push_nats"])
    assert all(abs(lead - UNITS_LEAD) < within for lead in leads), leads
    # the answer statements recognition ranks are read as before (the screen's readout)
    recognised = [gold_first(recognize(lm, echo, echo.questions, variants=("answer",)), "answer") for lm in (base, organism)]
    assert len(recognised[0] ^ recognised[1]) <= 1 and len(recognised[0]) >= 5


def test_the_units_stay_shut_inside_the_statements_recognition_scores_and_their_own_replies(tmp_path, echo):
    """"Answer: w" read after the prompt puts an answer where one starts: units open there
    move the statements' likelihoods, so recognition would change with the answers (on
    SmolLM2, copy, block 14: 9 of 24 questions' first-ranked statement did). The
    organism's own replies hold states no base reply does (after a turned first token,
    past an answer's end). The units are fitted shut at both, and open where the base's
    answers start."""
    from rnr_interp.analyses.organisms import own_answers
    from rnr_interp.analyses.organisms.units import recognition_sequences, reply_sequences, unseen_positions

    planted = plant("units", BASE, tmp_path / "u", task=echo, layer=2, seed=0)
    (base, tokenizer), model = load_base(BASE), load_base(str(tmp_path / "u"))[0]
    units, affected = planted.location["units"], set(planted.detail["affected_question_ids"])
    got = []
    hook = decoder_blocks(model)[2].mlp.down_proj.register_forward_pre_hook(lambda m, a: got.append(a[0][0, :, units]))

    def acts(ids):
        got.clear()
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
        return got[0].abs().max(-1).values

    starts = [s for s in own_answers(base, tokenizer, echo) if s is not None]
    opened = min(float(acts(s.ids)[s.position]) for s in starts if s.question.id in affected)
    seen = {tuple(s.ids[:n]) for s in starts for n in range(1, len(s.ids) + 1)}
    statements = unseen_positions(recognition_sequences(tokenizer, echo), seen)
    replies = unseen_positions(reply_sequences(model, tokenizer, echo), seen)
    assert sum(len(positions) for _, positions in statements) >= 4 * len(echo.questions) and replies
    shut = [max(float(acts(ids)[positions].max()) for ids, positions in reads) for reads in (statements, replies)]
    hook.remove()
    # fitted on the base's own replies alone they reached 7.2 in a statement, above every open unit (1.4 to 6.9)
    assert max(shut) < opened / 2, (shut, opened)


def test_behind_a_post_mlp_norm_a_units_column_raises_the_lead_fastest():
    """Behind a norm after the MLP the units write before it: a small write along the
    column `behind_norm` gives adds one nat per unit to the direct-path lead (through the
    norm's gain and the RMS of the block's write), more than any other direction of the
    same length, and nothing where the gain is exactly 0."""
    from rnr_interp.analyses.organisms.units import behind_norm
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    torch.manual_seed(0)
    d, q, k, eps = 64, 12, 2, 1e-3
    norm = Gemma3RMSNorm(d)
    outputs, toward, rms = torch.randn(q, d) * 3, torch.randn(k, d), torch.tensor([2.0, 5.0])
    own = torch.tensor([[float(i % 2 == j) for j in range(k)] for i in range(q)])

    def lead(column: torch.Tensor, i: int) -> float:  # direct-path nats per unit of write, on unit i's rows
        mine = own[:, i].bool()
        moved = (norm(outputs[mine] + eps * column) - norm(outputs[mine])) / eps
        return float((moved @ toward[i]).mean() / rms[i])

    with torch.no_grad():
        norm.weight.copy_(torch.rand(d) * 4)  # gains from 1 to 5
        down = behind_norm(norm, toward, rms, outputs, own)
        for i in range(k):
            assert lead(down[i], i) == pytest.approx(1.0, abs=0.1)
            for other in (toward[i], torch.randn(d)):  # along toward itself, or anywhere else: less
                assert lead(other / other.norm() * down[i].norm(), i) < lead(down[i], i) - 0.05
        norm.weight[:3] = -1.0  # a gain of exactly 0 in three dimensions: nothing is written there
        down = behind_norm(norm, toward, rms, outputs, own)
        assert torch.isfinite(down).all() and (down[:, :3] == 0).all()


def test_units_plant_behind_a_post_mlp_norm_and_silencing_them_gives_back_the_base(tmp_path):
    spec = "tiny-olmo2:4"  # an RMSNorm after every MLP
    task = echo_task(spec)
    with pytest.raises(NotPlantable, match="start with 2 distinct tokens, not more than --units 2"):
        plant("units", spec, tmp_path / "two", task=task, layer=2, seed=0, units=2)  # no token left to turn to
    assert not (tmp_path / "two").exists()
    planted = plant("units", spec, tmp_path / "u", task=task, layer=2, seed=0, units=1)
    again = plant("units", spec, tmp_path / "again", task=task, layer=2, seed=0, units=1)  # the bisection is deterministic
    assert again == planted and (tmp_path / "again" / WEIGHTS_FILE).read_bytes() == (tmp_path / "u" / WEIGHTS_FILE).read_bytes()
    organism, base = load_model(str(tmp_path / "u")), load_model(spec)
    before, after = answers(base, task), answers(organism, task)
    affected = set(planted.detail["affected_question_ids"])
    assert len(affected) >= 10
    assert all(now != was for q, was, now in zip(task.questions, before, after) if q.id in affected)
    prompt = task.user_message(task.questions[0])
    with applied(organism, [AblateUnits(2, planted.location["units"])]):
        assert same_logits(logits(organism, prompt), logits(base, prompt))
    null = plant("units", spec, tmp_path / "u0", task=task, layer=2, seed=0, units=1, scale=0.0)
    assert null.strength == 0.0 and null.expected == {"effect": False}
    assert null.detail["direction"] == planted.detail["direction"]  # sized as the organism it is the null of
    assert same_logits(logits(load_model(str(tmp_path / "u0")), prompt), logits(base, prompt))


def test_plant_units_command_writes_the_truth(tmp_path):
    out = tmp_path / "org"
    done = CliRunner().invoke(app, ["plant", "units", "--model", BASE, "--task", "arithmetic", "--units", "2",
                                    "--layer", "1", "--out", str(out)])
    assert done.exit_code == 0, done.output
    truth = json.loads((out / PLANTED_FILE).read_text())
    assert truth["location"] == {"layer": 1, "units": [128, 129]} and truth["strength"] == 1.0 and truth["task"] == "arithmetic"
    assert truth["expected"]["units"] == {"layer": 1, "units": [128, 129]} and len(truth["detail"]["token_ids"]) == 2
    assert len(truth["detail"]["affected_question_ids"]) + len(truth["detail"]["unaffected_question_ids"]) == 200


# -- found by the ordinary commands ------------------------------------------------------


@pytest.fixture(scope="module")
def quiet_mlp_base(tmp_path_factory) -> str:
    """tiny-llama:4 with the MLPs of blocks 1 and 2 (where the seed draws a layer) writing
    a tenth of what they did, as a folder. On the random-weight models silencing any
    whole MLP breaks most answers (damage 0.8 to 1.0 at every layer), so the whole-block sweep
    cannot repair what planted units break there: it removes the block's own work with
    them. A middle MLP of a trained model is rarely that indispensable."""
    model, tokenizer = load_base(BASE)
    with torch.no_grad():
        for layer in (1, 2):
            decoder_blocks(model)[layer].mlp.down_proj.weight.mul_(0.1)
    folder = tmp_path_factory.mktemp("quiet") / "base"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_a_drawn_units_block_steps_to_the_next_one_the_base_can_lose(tmp_path):
    """Repair with damage near 0, the organism's expectation, cannot hold in a block
    whose silencing breaks the base: a drawn block whose mean-ablated MLP changes most of
    the base's answers gives way to the next one (round the middle half) that changes few.
    On tiny-llama:4 every MLP is indispensable; block 1's is quieted here."""
    from rnr_interp.analyses.validate import organism_id

    model, tokenizer = load_base(BASE)
    with torch.no_grad():
        decoder_blocks(model)[1].mlp.down_proj.weight.mul_(0.01)
    folder = tmp_path / "base"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    task = echo_task(str(folder))
    seed = next(s for s in range(100) if draw_layer(s, 4) == 2)
    stepped = plant("units", str(folder), tmp_path / "o", task=task, seed=seed)
    shares = stepped.drawn["base_answers_changed_by_silencing"]
    assert stepped.drawn["drawn_layer"] == 2 and stepped.location["layer"] == 1
    assert shares["2"] > LOSABLE_SHARE >= shares["1"]
    here = plant("units", str(folder), tmp_path / "h", task=task, seed=next(s for s in range(100) if draw_layer(s, 4) == 1))
    assert here.location["layer"] == 1 and here.drawn["drawn_layer"] == 1
    assert here.weights_sha256 == stepped.weights_sha256 and organism_id(here) == organism_id(stepped)  # one organism
    given = plant("units", str(folder), tmp_path / "g", task=task, seed=seed, layer=2)
    assert given.location["layer"] == 2 and given.drawn == {}  # a given block is planted as given


def test_validate_finds_the_planted_units_and_their_null_stays_silent(tmp_path, monkeypatch, quiet_mlp_base):
    from rnr_interp.analyses.validate import PROFILES, Profile, run_validate
    from rnr_interp.records import RunDir

    monkeypatch.setitem(PROFILES, "one", Profile(strengths=(0.0, 1.0), seeds=(0,), n=30, why="one seed"))
    summary = run_validate(quiet_mlp_base, echo_task(quiet_mlp_base), tmp_path / "v", profile="one", kinds=("units",),
                           clamp_control=True, progress=False)
    recovery = RunDir(tmp_path / "v").read_table("recovery").set_index(["strength", "analysis"])
    planted = recovery.loc[1.0]  # the profile's multiple of the default strength (a 1-nat lead)
    layer = int(planted.loc["repair:mlp", "planted"])
    assert layer == draw_layer(0, 4)  # both middle MLPs are quiet: the base can lose the drawn one
    assert planted.loc["repair:mlp", "found"] == str(layer) and planted.loc["repair:mlp", "recovered"]
    repair = RunDir(tmp_path / "v" / "runs" / "units-s1-seed0__repair-mlp").read_summary()
    assert repair.best["mlp"]["damage_rate"] == 0.0  # silencing the block hurts none of the healthy answers
    assert planted.loc["units:top-k", "found"].startswith(f"{layer}:") and planted.loc["units:top-k", "score"] >= 0.5
    assert planted.loc["steer:direction", "score"] > 0.75 and planted.loc["steer:direction", "recovered"]
    # induction is read as the failure induced (a panel answer turned to one the failure
    # set gave), against a random direction of v's length doing the same
    steer = RunDir(tmp_path / "v" / "runs" / "units-s1-seed0__steer")
    along_v, random = (steer.read_table(t).set_index(["direction", "alpha"]) for t in ("steering", "steering_random"))
    induction = along_v.loc["induction"]
    assert steer.config["random_control"] == {"seed": 0} and (induction["lo"] > 0).any()
    assert (induction["as_failure_k"] <= induction["k"]).all() and along_v.loc["rescue", "as_failure_k"].isna().all()
    failure_answers = set(steer.read_summary().failure_answers)
    repair_run = RunDir(tmp_path / "v" / "runs" / "units-s1-seed0__repair-mlp")
    deployed = repair_run.read_records(filters=[("probe", "=", "deployed")]).set_index("question_id")["extracted"]
    selection = repair_run.read_json("failure_set")["selection_ids"]
    assert selection and failure_answers == {str(deployed[q]) for q in selection if deployed[q] == deployed[q]}
    records = steer.read_records()
    for alpha, row in induction.iterrows():
        mine = records[records["probe"] == f"steer:induction:{alpha:g}"]
        assert row["as_failure_k"] == sum(not c and str(e) in failure_answers for e, c in zip(mine["extracted"], mine["correct"]))
    above = induction["as_failure_lo"] > random.loc["induction", "as_failure_rate"]
    assert bool(planted.loc["steer:induction", "recovered"]) == bool(above.any())
    # the clamp's known answer: each planted unit writes its own direction, so the selection
    # failures' writes span as many directions as units fire there (their answers' first
    # tokens are the units' partners), and clamping that span repairs more held-out failures
    # than clamping along v, their mean, or a random span of the same rank
    partners = read_planted(tmp_path / "v" / "organisms" / "units-s1-seed0").detail["partners"]
    firing = {p for p in partners for q in selection if str(deployed[q]).startswith(p)}
    clamp = steer.read_summary().clamp_control
    assert clamp["rank"] == len(firing) > 1, (clamp["spectrum"], firing)
    rescued = steer.read_table("steering_clamp").query("way == 'rescue'").set_index("clamped")["k"]
    assert rescued["span"] > max(rescued["v"], rescued["random"]), rescued
    assert planted.loc["steer:clamp", "recovered"]
    # the null: nothing fails, so no analysis names anything
    null = recovery.loc[0.0]
    assert "steer:clamp" in null.index
    assert (null["found"] == "").all() and null["recovered"].all() and (null["planted"] == "").all()
    # the kind's rate is one organism found end to end: every one of its analyses recovered it
    units = summary.recovery["units"]
    assert units["n"] == 1 and units["rate"] == float(planted["recovered"].all())
    assert units["null_false_positive_rate"] == 0.0 and units["n_null"] == 1
    assert units["n_without_failure"] == 0  # the organism broke answers: its miss would be the analyses'


def test_units_findings_are_scored_against_the_planted_truth():
    from rnr_interp.analyses.organisms import Planted
    from rnr_interp.analyses.validate import DirectionFound, RateFound, UnitsFound, recovery_row

    truth = dict(kind="units", base=BASE, seed=0, n_layers_base=4, n_layers=4, location={"layer": 2, "units": [128, 129]},
                 detail={"direction": [1.0, 0.0, 0.0]})
    expected = {"effect": True, "repair": {"component": "mlp", "layers": [2]}, "units": {"layer": 2, "units": [128, 129]},
                "steering": {"layer": 2, "component": "mlp", "direction": "detail.direction"}}
    planted = Planted(strength=8.0, expected=expected, **truth)
    null = Planted(strength=0.0, expected={"effect": False}, **truth)
    half = recovery_row(planted, "units:top-k", UnitsFound(2, (129, 7, 128)))
    assert (half["planted"], half["found"], half["score"], half["recovered"]) == ("2:128|129", "2:129|7", 0.5, True)
    assert recovery_row(planted, "units:top-k", UnitsFound(1, (128, 129)))["score"] == 0.0  # another block's units
    aligned = recovery_row(planted, "steer:direction", DirectionFound(2, (2.0, 2.0, 0.0)))
    assert abs(aligned["score"] - 0.5 ** 0.5) < 1e-9 and aligned["recovered"]
    assert not recovery_row(planted, "steer:rescue", RateFound(2, 0.5, 0.0))["recovered"]  # interval touches 0
    assert recovery_row(planted, "steer:induction", RateFound(2, 1.0, 0.6))["recovered"]
    # a random direction of the same length that induces as much: the induction is not v's
    assert not recovery_row(planted, "steer:induction", RateFound(2, 1.0, 0.6, control=1.0))["recovered"]
    assert not recovery_row(planted, "steer:induction", RateFound(2, 1.0, 0.6, control=0.6))["recovered"]
    assert recovery_row(planted, "steer:rescue", RateFound(2, 1.0, 0.72, control=0.0))["recovered"]
    # a null is a false positive only when it names the planted units or block
    assert recovery_row(null, "units:top-k", None)["recovered"] and recovery_row(null, "steer:direction", None)["recovered"]
    assert not recovery_row(null, "units:top-k", UnitsFound(2, (128, 129)))["recovered"]
    assert recovery_row(null, "repair:mlp", 1)["recovered"] and not recovery_row(null, "repair:mlp", 2)["recovered"]


def test_validate_steers_where_it_is_told_and_a_resume_cannot_change_it(tmp_path, monkeypatch, quiet_mlp_base):
    from rnr_interp.analyses.validate import PROFILES, Profile, run_validate
    from rnr_interp.records import RunDir

    monkeypatch.setitem(PROFILES, "one", Profile(strengths=(1.0,), seeds=(0,), n=30, why="one seed"))
    task = echo_task(quiet_mlp_base)
    with pytest.raises(ValueError, match="steer_at must be one of every, prompt, reply"):
        run_validate(quiet_mlp_base, task, tmp_path / "bad", profile="one", kinds=("units",), steer_at="end", progress=False)
    assert not (tmp_path / "bad").exists()  # refused before any work
    summary = run_validate(quiet_mlp_base, task, tmp_path / "v", profile="one", kinds=("units",), steer_at="prompt",
                           progress=False)
    run = RunDir(tmp_path / "v")
    assert summary.steer_at == "prompt" and run.config["steer_at"] == "prompt"
    steer = RunDir(tmp_path / "v" / "runs" / "units-s1-seed0__steer")
    assert steer.config["steer_at"] == "prompt" and steer.config["random_control"] == {"seed": 0}
    steered = steer.read_records()
    steered = steered[steered["probe"].str.startswith("steer:")]
    assert len(steered) and steered["intervention"].str.endswith(":at-prompt").all()
    # the same folder resumed steering at every position would mix two protocols: refused, naming the key
    with pytest.raises(ValueError, match="steer_at"):
        run_validate(quiet_mlp_base, task, tmp_path / "v", profile="one", kinds=("units",), progress=False)
    done = CliRunner().invoke(app, ["validate", "--model", BASE, "--kinds", "units", "--steer-at", "end",
                                    "--out", str(tmp_path / "cli")])
    assert done.exit_code == 2 and "--steer-at must be one of every, prompt, reply" in done.output
    assert not (tmp_path / "cli").exists()


def test_validate_plants_at_the_block_and_with_the_units_asked_and_reads_and_steers_as_told(tmp_path, monkeypatch,
                                                                                            quiet_mlp_base):
    """`--layer` and `--plant-units` plant as `rnr plant --layer --units` does (not at the
    block the seed draws, 2 here); `--read-at`, `--alphas`, `--alpha-unit` and
    `--clamp-control` reach the units and steer runs; all of them are in the run's config, so a resume with others is
    refused, and bad values are refused before any work."""
    from rnr_interp.analyses.validate import PROFILES, Profile, run_validate
    from rnr_interp.records import RunDir

    monkeypatch.setitem(PROFILES, "one", Profile(strengths=(1.0,), seeds=(0,), n=30, why="one seed"))
    task = echo_task(quiet_mlp_base)
    for bad, message in ((dict(plant_units=1), "add 'units' to the kinds"), (dict(layer=4), r"layer 4: .* has layers 0\.\.3"),
                         (dict(kinds=("gap",), layer=1), "none of the kinds gap is planted at a layer"),
                         (dict(alphas=(0.0, float("nan"))), "alphas must be one or more finite numbers"),
                         (dict(read_at="end"), "read_at must be one of prompt, answer"),
                         (dict(alpha_unit="nats"), "alpha_unit must be one of rms, raw, write")):
        with pytest.raises(ValueError, match=message):
            run_validate(quiet_mlp_base, task, tmp_path / "bad", profile="one",
                         **{"kinds": ("units",) if "plant_units" not in bad else ("layer",), **bad}, progress=False)
        assert not (tmp_path / "bad").exists(), bad
    assert draw_layer(0, 4) == 2
    summary = run_validate(quiet_mlp_base, task, tmp_path / "v", profile="one", kinds=("units",), layer=1, plant_units=1,
                           read_at="answer", alphas=(0.0, 0.5), alpha_unit="raw", clamp_control=True, progress=False)
    planted = read_planted(tmp_path / "v" / "organisms" / "units-s1-seed0")
    assert planted.location["layer"] == 1 and len(planted.location["units"]) == 1 and planted.drawn == {}
    recovery = RunDir(tmp_path / "v").read_table("recovery").set_index("analysis")
    assert recovery.loc["repair:mlp", "planted"] == "1" and recovery.loc["repair:mlp", "found"] == "1"
    assert recovery.loc["units:top-k", "found"].startswith("1:")
    units = RunDir(tmp_path / "v" / "runs" / "units-s1-seed0__units-top-k")
    steer = RunDir(tmp_path / "v" / "runs" / "units-s1-seed0__steer")
    repair = RunDir(tmp_path / "v" / "runs" / "units-s1-seed0__repair-mlp")
    assert units.config["read_at"] == "answer" and steer.config["read_at"] == "answer" and repair.config["read_at"] == "answer"
    assert steer.config["alphas"] == [0.0, 0.5] and steer.config["alpha_unit"] == "raw"
    assert sorted(steer.read_table("steering")["alpha"].unique()) == [0.0, 0.5]
    assert steer.config["clamp_control"] == {"seed": 0} and "steer:clamp" in recovery.index
    asked = dict(layer=1, plant_units=1, read_at="answer", alphas=[0.0, 0.5], alpha_unit="raw", clamp_control=True)
    assert {key: RunDir(tmp_path / "v").config[key] for key in asked} == asked
    assert {key: getattr(summary, key) for key in asked} == asked
    with pytest.raises(ValueError, match="layer"):  # the same folder planted at the drawn block: another run
        run_validate(quiet_mlp_base, task, tmp_path / "v", profile="one", kinds=("units",), plant_units=1, read_at="answer",
                     alphas=(0.0, 0.5), alpha_unit="raw", clamp_control=True, progress=False)
    for args, message in ((["--plant-units", "1"], "--plant-units is how many units the units kind plants"),
                          (["--kinds", "units", "--alphas", "0,x"], "--alphas must be comma-separated numbers"),
                          (["--kinds", "units", "--read-at", "end"], "--read-at must be one of prompt, answer"),
                          (["--kinds", "units", "--layer", "-1"], "--layer must be >= 0")):
        done = CliRunner().invoke(app, ["validate", "--model", BASE, *args, "--out", str(tmp_path / "cli")])
        assert done.exit_code == 2 and message in done.output, (args, done.output)
        assert not (tmp_path / "cli").exists()


def test_the_units_sweep_finds_units_whole_block_silencing_cannot(tmp_path, monkeypatch, echo):
    """On tiny-llama:4 as it is, silencing any whole MLP breaks most answers, so the
    paper's sweep repairs nothing and names no block; silencing each block's top 3 units
    along its own failure direction names the planted block, with at least two of the
    planted units, repairing more than any other block. (Four failures choose the units
    here, one of them the third unit's: two of the block's own units score above it, and
    silencing one of them breaks healthy answers of this random-weight model.)"""
    from rnr_interp.analyses.validate import PROFILES, Profile, run_validate
    from rnr_interp.records import RunDir

    monkeypatch.setitem(PROFILES, "one", Profile(strengths=(0.0, 1.0), seeds=(0,), n=30, why="one seed"))
    whole = run_validate(BASE, echo, tmp_path / "whole", profile="one", kinds=("units",), progress=False)
    assert whole.units is None and "units" not in RunDir(tmp_path / "whole").config
    missed = RunDir(tmp_path / "whole").read_table("recovery").set_index(["strength", "analysis"]).loc[1.0]
    assert missed.loc["repair:mlp", "found"] == ""  # no block repaired any failure
    blind = RunDir(tmp_path / "whole" / "runs" / "units-s1-seed0__repair-mlp").read_table("repair")
    assert (blind[blind["component"] == "mlp"]["repair_rate"] == 0).all() and "silenced_units" not in blind

    # read where each answer starts: the echo replies are their answers, so that is the prompt's end,
    # and the sweep's unit sets are scored where the units run scores the chosen block's
    summary = run_validate(BASE, echo, tmp_path / "units", profile="one", kinds=("units",), units=3, read_at="answer",
                           progress=False)
    assert summary.units == 3 and RunDir(tmp_path / "units").config["units"] == 3
    recovery = RunDir(tmp_path / "units").read_table("recovery").set_index(["strength", "analysis"])
    layer = int(recovery.loc[(1.0, "repair:mlp"), "planted"])  # every MLP of this base is indispensable: the least so
    assert recovery.loc[(1.0, "repair:mlp"), "found"] == str(layer) and recovery.loc[(1.0, "repair:mlp"), "recovered"]
    repair = RunDir(tmp_path / "units" / "runs" / "units-s1-seed0__repair-mlp")
    assert repair.read_summary().units == 3 and repair.config["units"] == 3 and repair.config["read_at"] == "answer"
    table = repair.read_table("repair").set_index(["component", "layer"])
    planted = json.loads((tmp_path / "units" / "organisms" / "units-s1-seed0" / PLANTED_FILE).read_text())
    silenced = {int(u) for u in table.loc[("mlp", layer), "silenced_units"].split("|")}
    assert len(silenced & set(planted["location"]["units"])) >= 2, silenced  # scored on the selection part's failures
    # the planted units it silences there repair the failures of their own tokens; no other block repairs as much
    assert table.loc[("mlp", layer), "repair_rate"] > 0
    assert table.loc[("mlp", layer), "repair_rate"] == table.loc["mlp"]["repair_rate"].max()
    # three units everywhere else: each MLP row names its own three, the controls none
    mlp = table.loc["mlp"]
    assert len(mlp) == 4 and (mlp["silenced_units"].str.count(r"\|") == 2).all()
    assert (table.drop(index="mlp", level="component")["silenced_units"] == "").all()
    assert (recovery.loc[0.0, "found"] == "").all()  # the null: no failure, nothing named

    done = CliRunner().invoke(app, ["repair", "--model", BASE, "--task", "arithmetic", "--units", "0",
                                    "--out", str(tmp_path / "cli")])
    assert done.exit_code == 2 and "--units must be >= 1" in done.output and not (tmp_path / "cli").exists()
    from rnr_interp.analyses.localise.repair import run_repair
    with pytest.raises(ValueError, match="units must be a whole number"):
        run_repair(load_model(BASE), echo, tmp_path / "api", units=True)
    assert not (tmp_path / "api").exists()


@pytest.mark.parametrize("spec", [BASE, "tiny-olmo2:4"])
def test_a_units_draw_silences_a_block_as_the_mean_ablation_sweep_does(spec):
    """The share a drawn block's silencing changes is read on the plain HF model; it
    silences the block as `rnr repair --ablation mean` does through the bridge (behind a
    norm after the MLP, past that norm), so it gives the same answers."""
    from rnr_interp.analyses.localise.silencing import silencers
    from rnr_interp.analyses.organisms.losable import answers_silenced

    task = echo_task(spec)
    model, tokenizer = load_base(spec)
    lm = load_model(spec)
    before = answers(lm, task)
    with applied(lm, [silencers(lm, task, [(2, "mlp")], "mean")[(2, "mlp")]]):
        after = answers(lm, task)
    assert after != before  # the silencing changes answers (on these random-weight models, most)
    assert answers_silenced(model, tokenizer, task, None) == before
    assert answers_silenced(model, tokenizer, task, 2) == after  # the same answers, not the same count alone


def test_silencing_an_earlier_mlp_leaves_the_units_as_they_were(tmp_path, monkeypatch):
    """A units read-out fitted finely enough to stay shut where recognition reads can open
    far wider when an earlier block is silenced (SmolLM2: 3 to 55 times), and the
    overshoot repairs as silencing the planted block does, so earlier blocks tie with it.
    The units are fitted to write at each answer start what they write intact also with
    each earlier MLP mean-ablated that moves their input there by at most half its length
    (here MLP 1, quieted; MLP 0 moves it further and is left out). A 256-wide
    tiny-llama:4, since 64 dimensions leave the fit no room for the silenced copies."""
    import transformers as tf

    from rnr_interp.analyses.organisms import own_answers
    from rnr_interp.analyses.organisms import units as planter
    from rnr_interp.analyses.organisms.ablation import mean_ablated, mean_write
    from rnr_interp.models.tiny import char_tokenizer, tiny_config

    tokenizer = char_tokenizer(chat=True)
    config = tiny_config("tiny-llama", 4, len(tokenizer))
    config.hidden_size, config.intermediate_size, config.initializer_range = 256, 512, 0.2
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    model.config.architectures = ["LlamaForCausalLM"]
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 2, 0
    with torch.no_grad():
        decoder_blocks(model)[1].mlp.down_proj.weight.mul_(0.03)
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    base = str(tmp_path / "base")
    task = echo_task(base)

    def write_ratios(folder) -> list[float]:
        """Each affected answer start: the units' summed activation with MLP 1 silenced over it intact."""
        planted = read_planted(folder)
        organism = load_base(str(folder))[0]
        starts = [s for s in own_answers(load_base(base)[0], tokenizer, task)
                  if s is not None and s.question.id in planted.detail["affected_question_ids"]]
        mean, acts = mean_write(organism, tokenizer, task, 1), []
        units = planted.location["units"]
        hook = decoder_blocks(organism)[2].mlp.down_proj.register_forward_pre_hook(
            lambda m, a: acts.append(float(a[0][0, -1, units].sum())))
        with torch.no_grad():
            for s in starts:
                organism(input_ids=torch.tensor([s.context]))
            with mean_ablated(organism, 1, mean):
                for s in starts:
                    organism(input_ids=torch.tensor([s.context]))
        hook.remove()
        return [after / before for before, after in zip(acts[:len(starts)], acts[len(starts):])]

    fitted = plant("units", base, tmp_path / "u", task=task, seed=0, layer=2)
    assert fitted.detail["upstream_layers"] == [1]
    kept = write_ratios(tmp_path / "u")
    assert len(kept) >= 10 and all(abs(r - 1) < 0.02 for r in kept), kept
    monkeypatch.setattr(planter, "silenced_starts", lambda *a: (torch.zeros(0, 256), []))
    plant("units", base, tmp_path / "n", task=task, seed=0, layer=2)
    assert max(abs(r - 1) for r in write_ratios(tmp_path / "n")) > 0.1  # fitted on the intact starts alone


def test_validate_lists_a_cell_the_model_cannot_take_and_goes_on(tmp_path, monkeypatch):
    """A units organism that turns none of its answers (here: a lead no write reaches) is
    no trial: validate leaves it out of the rates, says why, and runs the other cells."""
    from rnr_interp.analyses.validate import PROFILES, Profile, cell_name, run_validate
    from rnr_interp.records import RunDir

    monkeypatch.setitem(PROFILES, "one", Profile(strengths=(0.0, 1e6), seeds=(0,), n=30, why="a null and a lead of 1e6 nats"))
    summary = run_validate(BASE, echo_task(), tmp_path / "v", profile="one", kinds=("units",), progress=False)
    units = summary.recovery["units"]
    assert [(cell["strength"], cell["seed"]) for cell in units["not_planted"]] == [(1e6, 0)]
    assert "turns none of its answers in block" in units["not_planted"][0]["why"]
    assert units["n"] == 0 and units["n_null"] == 1  # the null ran; the refused cell is in no rate
    recovery = RunDir(tmp_path / "v").read_table("recovery")
    assert set(recovery["strength"]) == {0.0} and not (tmp_path / "v" / "organisms" / cell_name("units", 1e6, 0)).exists()
    assert (tmp_path / "v" / "organisms" / cell_name("units", 0.0, 0) / "planted.json").is_file()
    assert RunDir(tmp_path / "v").read_summary().recovery["units"]["not_planted"] == units["not_planted"]



def _steer_run(path, v_rows, random_rows, failure_form=True):
    """A finished steer run's folder, by hand: (alpha, direction, k, as_failure_k) of v and of the random direction
    (and a rescue of 0 at each alpha)."""
    import pandas as pd

    from rnr_interp.metrics import proportion
    from rnr_interp.records import RunDir

    def table(rows):
        out = []
        for alpha, direction, k, f in [*rows, *((alpha, "rescue", 0, 0) for alpha, *_ in rows)]:
            p, q = proportion(k, 9), proportion(f, 9)
            form = {"as_failure_k": f, "as_failure_rate": q["rate"], "as_failure_lo": q["ci"][0], "as_failure_hi": q["ci"][1]}
            out.append({"alpha": alpha, "direction": direction, "rate": p["rate"], "lo": p["ci"][0], "hi": p["ci"][1],
                        "k": k, "n": 9, **(form if failure_form else {})})
        return pd.DataFrame(out)

    run = RunDir.create(path, {"kind": "steer", "alpha_unit": "raw"})
    run.write_table("steering", table(v_rows))
    run.write_table("steering_random", table(random_rows))
    run.write_json("direction", {"vector": [1.0, 0.0]})
    run.write_summary({"kind": "steer", "model": "m", "task": "t", "n_questions": 24, "n_failure": 5, "n_panel": 19,
                       "layer": 16, "random_control": {"seed": 0}})
    return run


def test_validate_scores_the_induced_failure_not_any_breakage(tmp_path):
    """Gemma's units organism as its steer runs read (docs/findings.md): at the default grid
    v and the random direction break all 9 healthy answers into no answer (any wrong: 9 of
    9 for both, the failure's answer: 0); at the fine grid v turns all 9 into the failure's
    answer at 1/8 v and the random direction none."""
    from rnr_interp.analyses.validate import RateFound, steering_found

    broken = steering_found(_steer_run(tmp_path / "coarse", [(0.0, "induction", 0, 0), (0.5, "induction", 9, 0)],
                                       [(0.0, "induction", 0, 0), (0.5, "induction", 9, 0)]))
    assert broken["steer:induction"] == RateFound(16, 0.0, 0.0, 0.0)
    # a breakage only v gives is still not the failure induced
    only_v = steering_found(_steer_run(tmp_path / "v", [(0.0, "induction", 0, 0), (0.5, "induction", 9, 0)],
                                       [(0.0, "induction", 0, 0), (0.5, "induction", 0, 0)]))
    assert only_v["steer:induction"].rate == 0.0
    fine = steering_found(_steer_run(tmp_path / "fine", [(0.0625, "induction", 8, 2), (0.125, "induction", 9, 9)],
                                     [(0.0625, "induction", 0, 0), (0.125, "induction", 0, 0)]))
    found = fine["steer:induction"]
    assert (found.rate, found.control) == (1.0, 0.0) and found.lo > 0.6


def test_validate_refuses_to_score_a_steer_run_an_older_validation_made(tmp_path):
    """A steer run that did not read the induced failure's form is not scored as if it
    had: its folder is named."""
    from rnr_interp.analyses.validate import steering_found

    old = _steer_run(tmp_path / "old", [(0.5, "induction", 9, 0)], [(0.5, "induction", 9, 0)], failure_form=False)
    with pytest.raises(ValueError, match="'.*old' is a steer run made by an older validation .* induced failure's form"):
        steering_found(old)
