"""The site table names real hook points in every family, reads see what writes change,
and the probe-label type writes exactly the strings records have always held."""

from __future__ import annotations

import pytest
import torch

from rnr_interp.engine.generate import forward, left_pad
from rnr_interp.interventions import SITES, Ablate, AblateUnits, Steer, applied, capturing, family, set_id, site_hook
from rnr_interp.models import load_model
from rnr_interp.records import DEPLOYED, ProbeLabel


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gpt2", "tiny-gemma", "tiny-olmo2", "tiny-gemma3"])
def lm(request):
    return load_model(f"{request.param}:2")


def test_every_site_is_a_hook_point_that_fires(lm):
    ids, mask = left_pad([[5, 6, 7], [8, 9]], lm.pad_id, lm.device)
    sites = [s for s in SITES[family(lm)] if s != "post_mlp_norm"]  # a module, not a hook point
    names = [site_hook(lm, s, 1) for s in sites]
    with torch.inference_mode(), capturing(lm, names) as got:
        forward(lm, ids, mask)
    for site, name in zip(sites, names):
        assert len(got[name]) == 1 and got[name][0].shape[:2] == (2, 3), (site, name)
    with pytest.raises(ValueError, match="unknown site"):
        site_hook(lm, "hook_nowhere", 0)


def test_a_read_sees_the_write_in_force(lm):
    ids, mask = left_pad([[5, 6, 7]], lm.pad_id, lm.device)
    name = site_hook(lm, "hook_mlp_out", 0)
    with torch.inference_mode(), applied(lm, [Ablate("mlp", 0)]), capturing(lm, [name]) as got:
        forward(lm, ids, mask)
    assert torch.count_nonzero(got[name][0]) == 0
    with torch.inference_mode(), capturing(lm, [name]) as got:
        forward(lm, ids, mask)
    assert torch.count_nonzero(got[name][0]) > 0


def test_post_mlp_norm_families_read_the_mlp_before_its_norm():
    for fam in ("gemma2", "gemma3", "olmo2"):
        assert SITES[fam]["mlp.hook_out"] == "blocks.{layer}.mlp.hook_out"
        assert SITES[fam]["post_mlp_norm"] == "blocks.{layer}.ln2_post"
    assert SITES["default"]["mlp.hook_out"] == SITES["default"]["hook_mlp_out"]


@pytest.mark.parametrize("spec", ["tiny-gemma2:1", "tiny-gemma3:1", "tiny-olmo2:1"])
def test_post_mlp_norm_sites_sit_either_side_of_the_norm(spec):
    """In the built models: hook_mlp_out is the norm's output (what reaches the residual
    stream), mlp.hook_out its input (the MLP's own output)."""
    lm = load_model(spec)
    ids, mask = left_pad([[5, 6, 7]], lm.pad_id, lm.device)
    sites = ("hook_mlp_out", "mlp.hook_out")
    names = [site_hook(lm, s, 0) for s in sites] + ["blocks.0.ln2_post.hook_out", "blocks.0.ln2_post.hook_in"]
    with torch.inference_mode(), capturing(lm, names) as got:
        forward(lm, ids, mask)
    out, mlp, norm_out, norm_in = (got[n][0] for n in names)
    assert torch.equal(out, norm_out) and torch.equal(mlp, norm_in) and not torch.allclose(out, mlp)


def test_probe_labels_are_the_strings_records_hold():
    cases = {
        ProbeLabel.deployed(): DEPLOYED,
        ProbeLabel.sample("temperature"): "temperature",
        ProbeLabel.ablate("mlp", 3): set_id([Ablate("mlp", 3)]),
        ProbeLabel.steer("rescue", 0.5): "steer:rescue:0.5",
        ProbeLabel.steer("induction", 2.0): "steer:induction:2",
        ProbeLabel.units("top", 16): "units:top:16",
        ProbeLabel.units("random", 16, 3): "units:random:16:3",
        ProbeLabel.route("native", "mcts"): "native:mcts",
        ProbeLabel.route("skiponly", "genetic_blind"): "skiponly:genetic_blind",
        ProbeLabel.rotated(ProbeLabel.deployed(), 1): "rotated:1:deployed",
        ProbeLabel.rotated(ProbeLabel.ablate("mlp", 3), 1): "rotated:1:ablate:mlp:3",
        ProbeLabel.rotated(ProbeLabel.steer("rescue", 0.5), 2): "rotated:2:steer:rescue:0.5",
    }
    for label, text in cases.items():
        assert str(label) == text
        assert ProbeLabel.parse(text) == label
    with pytest.raises(ValueError, match="unrecognised probe label"):
        ProbeLabel.parse("a:b:c:d")
    for text in ("rotated:1:a:b:c:d", "rotated:x:deployed", "rotated:1:rotated:1:deployed"):
        with pytest.raises(ValueError, match="unrecognised probe label"):
            ProbeLabel.parse(text)


def test_every_spec_labels_itself():
    specs = [Ablate("attn", 1), Steer(0, (1.0, 2.0), 0.5, "hook_mlp_out"), AblateUnits(1, (3, 1))]
    assert set_id(specs).split("|") == [s.label() for s in specs]
    assert [s.layers() for s in specs] == [(1,), (0,), (1,)]
