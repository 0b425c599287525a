"""Any TransformerLens hook as a site, head ablation, and activation patching against
independent computations through the bridge's own `run_with_hooks`."""

from __future__ import annotations

import pytest
import torch

from rnr_interp.analyses.patching import COLUMNS, mean_recovered, patching_sweep
from rnr_interp.engine.generate import forward, left_pad
from rnr_interp.interventions import AblateHead, Steer, applied, block_hook_names, capturing, site_hook, split_hook_name
from rnr_interp.models import load_model
from rnr_interp.report.patching_figures import patching_heatmap


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2", "tiny-gemma3"])
def lm(request):
    return load_model(f"{request.param}:3")


def pairs(lm):
    """Clean and corrupted prompts of equal lengths, differing in one token, and the
    clean run's top token against the corrupted run's as the answer pair."""
    clean = [[5, 6, 7, 8], [9, 10, 11, 12, 13]]
    corrupted = [[5, 6, 30, 8], [9, 40, 11, 12, 13]]
    ids, mask = left_pad(clean + corrupted, lm.pad_id, lm.device)
    with torch.inference_mode():
        top = forward(lm, ids, mask, last_only=True)[0][:, -1].argmax(-1).tolist()
    answers = [(top[0], top[2] if top[2] != top[0] else top[0] + 1), (top[1], top[3] if top[3] != top[1] else top[1] + 1)]
    return clean, corrupted, answers


def test_transformer_lens_names_are_sites(lm):
    assert site_hook(lm, "hook_resid_mid", 1) == "blocks.1.hook_resid_mid"
    assert site_hook(lm, "ln1.hook_normalized", 2) == "blocks.2.ln1.hook_normalized"
    assert site_hook(lm, "blocks.2.attn.hook_z", 2) == "blocks.2.attn.hook_z"
    assert split_hook_name("blocks.8.hook_resid_pre") == (8, "hook_resid_pre")
    assert "attn.hook_z" in block_hook_names(lm)
    with pytest.raises(ValueError, match="in block 2, but the intervention names layer 1"):
        site_hook(lm, "blocks.2.hook_resid_pre", 1)
    with pytest.raises(ValueError, match="unknown site 'attn.hook_nowhere'"):
        site_hook(lm, "attn.hook_nowhere", 0)


def test_a_steer_at_a_transformer_lens_site_moves_that_point(lm):
    ids, mask = left_pad([[5, 6, 7]], lm.pad_id, lm.device)
    name = site_hook(lm, "ln1.hook_normalized", 1)
    vector = tuple([1.0] * lm.bridge.cfg.d_model)
    with torch.inference_mode(), capturing(lm, [name]) as plain:
        forward(lm, ids, mask)
    with torch.inference_mode(), applied(lm, [Steer(1, vector, 2.0, site="ln1.hook_normalized")]), capturing(lm, [name]) as got:
        forward(lm, ids, mask)
    assert torch.allclose(got[name][0], plain[name][0] + 2.0)


def test_head_ablation_equals_zeroing_the_head_by_hand(lm):
    ids, mask = left_pad([[5, 6, 7, 8], [9, 10]], lm.pad_id, lm.device)

    def zero(act, hook):
        act = act.clone()
        act[:, :, 1] = 0
        return act

    with torch.inference_mode():
        with applied(lm, [[AblateHead(2, 1)], []]):
            ours = forward(lm, ids, mask)[0]
        by_hand = lm.bridge.run_with_hooks(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                                           fwd_hooks=[("blocks.2.attn.hook_z", zero)])
        plain = forward(lm, ids, mask)[0]
    real = mask[0].bool()
    assert torch.allclose(ours[0][real], by_hand[0][real], atol=1e-5)
    assert not torch.allclose(ours[0][real], plain[0][real], atol=1e-5)
    assert torch.equal(ours[1], plain[1])  # the row without the spec is untouched
    with pytest.raises(ValueError, match="heads 0..3"):
        with applied(lm, [AblateHead(0, 4)]):
            pass


def test_head_patching_equals_patching_one_head_by_hand(lm):
    clean, corrupted, answers = pairs(lm)
    table = patching_sweep(lm, clean, corrupted, answers, rows_per_batch=5)
    assert list(table.columns) == COLUMNS and len(table) == 2 * 3 * 4
    layer, head = 1, 2
    ids, mask = left_pad(clean + corrupted, lm.pad_id, lm.device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    name = f"blocks.{layer}.attn.hook_z"
    with torch.inference_mode():
        _, cache = lm.bridge.run_with_cache(ids[:2], attention_mask=mask[:2], position_ids=pos[:2], names_filter=[name])

        def patch(act, hook):
            act = act.clone()
            act[:, :, head] = cache[name][:, :, head]
            return act

        logits = lm.bridge.run_with_hooks(ids[2:], attention_mask=mask[2:], position_ids=pos[2:], fwd_hooks=[(name, patch)])
    for pair, (good, bad) in enumerate(answers):
        expected = float(logits[pair, -1, good] - logits[pair, -1, bad])
        got = table.query("pair == @pair and layer == @layer and head == @head")["logit_diff"].item()
        assert got == pytest.approx(expected, abs=1e-4)
    assert (table["logit_diff"] - table["corrupted_logit_diff"]).abs().max() > 1e-3  # some head matters
    # batching does not change a cell
    one_by_one = patching_sweep(lm, clean, corrupted, answers, rows_per_batch=1)
    assert one_by_one["logit_diff"].to_numpy() == pytest.approx(table["logit_diff"].to_numpy(), abs=1e-4)


def test_patching_the_whole_residual_stream_recovers_everything(lm):
    clean, corrupted, answers = pairs(lm)
    table = patching_sweep(lm, clean, corrupted, answers, level="layer", site="hook_resid_pre")
    assert table["head"].isna().all() and sorted(table["layer"].unique()) == [0, 1, 2]
    first = table[table["layer"] == 0]
    assert first["logit_diff"].to_numpy() == pytest.approx(first["clean_logit_diff"].to_numpy(), abs=1e-4)
    assert first["recovered"].to_numpy() == pytest.approx([1.0, 1.0], abs=1e-4)
    grid = mean_recovered(table)
    assert list(grid.columns) == ["layer"] and grid.loc[0, "layer"] == pytest.approx(1.0, abs=1e-4)


def test_patching_by_position_finds_the_token_that_differs(lm):
    """At block 0's input the runs differ only at the changed token: patching it there
    recovers everything, patching any other position nothing."""
    clean, corrupted, answers = pairs(lm)
    table = patching_sweep(lm, clean, corrupted, answers, level="layer", positions=[-1, -2, -4], layers=[0, 2])
    first = table[table["layer"] == 0].set_index(["pair", "position"])["recovered"]
    assert first[(0, -2)] == pytest.approx(1.0, abs=1e-4) and first[(1, -4)] == pytest.approx(1.0, abs=1e-4)
    assert [first[(0, -1)], first[(0, -4)], first[(1, -1)], first[(1, -2)]] == pytest.approx([0.0] * 4, abs=1e-4)
    assert list(mean_recovered(table).columns) == [-4, -2, -1]
    with pytest.raises(ValueError, match="-1..-4"):
        patching_sweep(lm, clean, corrupted, answers, level="layer", positions=[-5])
    with pytest.raises(ValueError, match="-1..-4"):
        patching_sweep(lm, clean, corrupted, answers, level="layer", positions=[0])


def test_patching_refuses_bad_pairs(lm):
    with pytest.raises(ValueError, match="equal lengths"):
        patching_sweep(lm, [[1, 2, 3]], [[1, 2]], [(1, 2)])
    with pytest.raises(ValueError, match="as many"):
        patching_sweep(lm, [[1, 2]], [[1, 2]], [])
    with pytest.raises(ValueError, match="level"):
        patching_sweep(lm, [[1, 2]], [[1, 3]], [(1, 2)], level="neuron")
    with pytest.raises(ValueError, match="one token each"):
        patching_sweep(lm, ["12+3"], ["12+4"], [("15 and more", "16")])


def test_text_prompts_and_answers_are_the_token_ids_they_encode_to(lm):
    (three,), (four,) = (lm.tokenizer(t, add_special_tokens=False).input_ids for t in ("3", "4"))
    by_ids = patching_sweep(lm, [lm.encode("1+2=")], [lm.encode("1+3=")], [(three, four)], level="layer")
    by_text = patching_sweep(lm, ["1+2="], ["1+3="], [("3", "4")], level="layer")
    assert by_text.equals(by_ids)


def test_patching_heatmap_is_layers_by_heads(lm):
    clean, corrupted, answers = pairs(lm)
    fig = patching_heatmap(patching_sweep(lm, clean, corrupted, answers))
    heat = fig.data[0]
    assert len(heat.y) == 3 and list(heat.x) == ["0", "1", "2", "3"]
    assert "2 pairs" in fig.layout.title.text
