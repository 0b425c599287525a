"""SAE features as directions: a small SAE trained in-process on a tiny model's residual
stream, written in SAELens's folder format, read back natively and used to steer,
ablate and clamp a feature, and to say which features a direction loads on."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import torch

import rnr_interp as rnr
from rnr_interp.engine.decoding import Decoding
from rnr_interp.engine.generate import forward, generate, left_pad
from rnr_interp.interventions import SAEFeature, Steer, applied, capturing, dumps, loads, site_hook
from rnr_interp.models import load_model
from rnr_interp.sae import SAE, feature_loadings, load_sae, save_sae

LAYER, D_SAE = 1, 32


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama:3")


def prompts(lm, n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, lm.bridge.cfg.d_vocab, (n, 8), generator=g).tolist()


def residuals(lm, n=96, seed=0):
    name = site_hook(lm, "hook_resid_pre", LAYER)
    ids, mask = left_pad(prompts(lm, n, seed), lm.pad_id, lm.device)
    with torch.inference_mode(), capturing(lm, [name]) as got:
        forward(lm, ids, mask)
    return got[name][0].reshape(-1, lm.bridge.cfg.d_model).clone()


def train_sae(x: torch.Tensor, steps: int = 400) -> SAE:
    """A standard (ReLU) SAE fitted by Adam to x with an L1 penalty."""
    torch.manual_seed(0)
    d_in = x.shape[1]
    W_dec = torch.nn.functional.normalize(torch.randn(D_SAE, d_in), dim=-1).requires_grad_()
    W_enc = W_dec.detach().T.clone().requires_grad_()
    b_enc = torch.zeros(D_SAE, requires_grad=True)
    b_dec = x.mean(0).clone().requires_grad_()
    opt = torch.optim.Adam([W_dec, W_enc, b_enc, b_dec], lr=1e-2)
    for _ in range(steps):
        f = torch.relu((x - b_dec) @ W_enc + b_enc)
        loss = (f @ W_dec + b_dec - x).pow(2).sum(-1).mean() + 1e-3 * f.abs().sum(-1).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return SAE(W_enc=W_enc.detach(), b_enc=b_enc.detach(), W_dec=W_dec.detach(), b_dec=b_dec.detach(),
               hook_name=f"blocks.{LAYER}.hook_resid_pre")


@pytest.fixture(scope="module")
def folder(lm, tmp_path_factory):
    with torch.inference_mode(False):
        sae = train_sae(residuals(lm))
    return str(save_sae(sae, tmp_path_factory.mktemp("sae")))


def test_the_trained_sae_reads_back_and_reconstructs(lm, folder):
    sae = load_sae(folder)
    assert (sae.d_in, sae.d_sae, sae.hook_name) == (lm.bridge.cfg.d_model, D_SAE, "blocks.1.hook_resid_pre")
    held_out = residuals(lm, n=32, seed=1)
    error = (sae.decode(sae.encode(held_out)) - held_out).pow(2).sum(-1).mean()
    spread = (held_out - held_out.mean(0)).pow(2).sum(-1).mean()
    assert error < 0.5 * spread  # it learned the activations, on prompts it never saw
    cfg = json.loads((Path(folder) / "cfg.json").read_text())
    assert cfg["metadata"]["hook_name"] == "blocks.1.hook_resid_pre" and cfg["architecture"] == "standard"


def test_steer_from_sae_is_the_features_decoder_row_at_the_sae_hook(lm, folder):
    spec = Steer.from_sae(folder, 3, alpha=8.0)
    assert (spec.layer, spec.site, spec.alpha) == (LAYER, "hook_resid_pre", 8.0)
    assert torch.allclose(torch.tensor(spec.vector), load_sae(folder).W_dec[3])
    ps = [lm.encode(lm.render(p)) for p in ["hello 12+3", "what is 7*8?"]]
    dec = Decoding(max_new_tokens=8)
    plain = [r[0].tokens for r in generate(lm, ps, decoding=dec)]
    steered = [r[0].tokens for r in generate(lm, ps, decoding=dec, interventions=[[Steer.from_sae(folder, 3, alpha=50.0)], []])]
    assert steered[0] != plain[0] and steered[1] == plain[1]
    with pytest.raises(ValueError, match="features 0..31"):
        Steer.from_sae(folder, 32)


@pytest.mark.parametrize("mode,value", [("ablate", 0.0), ("clamp", 3.0)])
def test_an_sae_feature_is_set_at_its_hook_and_the_rest_stays(lm, folder, mode, value):
    sae = load_sae(folder)
    name = site_hook(lm, "hook_resid_pre", LAYER)
    ids, mask = left_pad([[5, 6, 7, 8], [9, 10, 11, 12]], lm.pad_id, lm.device)
    with torch.inference_mode(), capturing(lm, [name]) as plain:
        forward(lm, ids, mask)
    feature = int(sae.encode(plain[name][0][0]).sum(0).argmax())  # one that is on for row 0
    spec = SAEFeature(folder, feature, mode, value)
    with torch.inference_mode(), applied(lm, [[spec], []]), capturing(lm, [name]) as got:
        forward(lm, ids, mask)
    x = plain[name][0]
    expected = x[0] + (value - sae.encode(x[0])[:, feature])[:, None] * sae.W_dec[feature]
    assert torch.allclose(got[name][0][0], expected, atol=1e-5)
    assert not torch.allclose(got[name][0][0], x[0], atol=1e-3)
    assert torch.equal(got[name][0][1], x[1])
    assert loads(dumps([spec])) == (spec,)
    assert spec.label().startswith(f"sae:{mode}:{Path(folder).name}@blocks.1.hook_resid_pre:{feature}")


def test_sae_feature_refuses_bad_specs(lm, folder):
    with pytest.raises(ValueError, match="mode"):
        SAEFeature(folder, 0, "boost")
    with pytest.raises(ValueError, match="clamp it"):
        SAEFeature(folder, 0, "ablate", 2.0)
    with pytest.raises(ValueError, match="features 0..31"):
        with applied(lm, [SAEFeature(folder, 99)]):
            pass


def test_feature_loadings_find_the_feature_a_direction_is_made_of(folder):
    sae = load_sae(folder)
    v = 2.0 * sae.W_dec[5] + 0.01 * torch.randn(sae.d_in, generator=torch.Generator().manual_seed(0))
    table = feature_loadings(sae, v, k=4)
    assert list(table.columns) == ["feature", "cosine"] and len(table) == 4
    assert table["feature"][0] == 5 and table["cosine"][0] > 0.99
    assert table["cosine"].abs().is_monotonic_decreasing
    flipped = feature_loadings(sae, -v, k=1)
    assert flipped["feature"][0] == 5 and flipped["cosine"][0] < -0.99
    with pytest.raises(ValueError, match="size 3"):
        feature_loadings(sae, torch.ones(3))
    with pytest.raises(ValueError, match="zero"):
        feature_loadings(sae, torch.zeros(sae.d_in))


def _write(folder, cfg, weights):
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    save_file(weights, str(folder / "sae_weights.safetensors"))
    return folder


def _weights(d_in=4, d_sae=6):
    g = torch.Generator().manual_seed(0)
    return {"W_enc": torch.randn(d_in, d_sae, generator=g), "b_enc": torch.zeros(d_sae),
            "W_dec": torch.randn(d_sae, d_in, generator=g), "b_dec": torch.zeros(d_in)}


def test_the_older_saelens_layout_and_topk_read(tmp_path):
    cfg = {"d_in": 4, "d_sae": 6, "hook_name": "blocks.0.hook_resid_post", "activation_fn_str": "topk",
           "activation_fn_kwargs": {"k": 2}, "apply_b_dec_to_input": False, "normalize_activations": "none"}
    sae = load_sae(_write(tmp_path / "old", cfg, _weights()))
    assert (sae.architecture, sae.k, sae.hook_name) == ("topk", 2, "blocks.0.hook_resid_post")
    f = sae.encode(torch.randn(5, 4, generator=torch.Generator().manual_seed(1)))
    assert ((f > 0).sum(-1) <= 2).all()


@pytest.mark.parametrize("cfg,weights,message", [
    ({"architecture": "gated", "metadata": {"hook_name": "blocks.0.hook_resid_pre"}}, None, "architecture 'gated'"),
    ({"metadata": {"hook_name": "blocks.0.hook_resid_pre"}, "normalize_activations": "layer_norm"}, None, "normalize_activations"),
    ({"metadata": {}}, None, "no hook_name"),
    ({"metadata": {"hook_name": "blocks.0.attn.hook_z", "hook_head_index": 1}}, None, "single heads"),
    ({"architecture": "jumprelu", "metadata": {"hook_name": "blocks.0.hook_resid_pre"}}, None, "threshold"),
    ({"metadata": {"hook_name": "blocks.0.hook_resid_pre"}, "d_sae": 7}, None, "d_sae is 7"),
    ({"metadata": {"hook_name": "blocks.0.hook_resid_pre"}}, {"W_enc": torch.zeros(4, 6)}, "lacks b_enc, W_dec, b_dec"),
])
def test_unreadable_sae_folders_are_refused_in_one_line(tmp_path, cfg, weights, message):
    with pytest.raises(ValueError, match=message):
        load_sae(_write(tmp_path / "bad", cfg, weights or _weights()))


def test_a_folder_without_the_files_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no cfg.json"):
        load_sae(tmp_path)


def test_the_readmes_sae_block_runs_on_a_tiny_model(lm, folder):
    """The README's second Python block (SAE features), as a user would paste it, on a
    trained SAE: both interventions generate and the loadings put feature 3 first."""
    section = (Path(__file__).resolve().parents[1] / "README.md").read_text().split("## Python API", 1)[1]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    assert "rnr.load_sae" in code and "rnr.feature_loadings" in code
    lm_ids = lm.encode(lm.render("2+2="))
    namespace = {"rnr": rnr, "model": lm, "prompt": lm_ids}
    exec(compile(code.replace("path/to/sae", folder), "README.md", "exec"), namespace)
    assert len(namespace["outs"]) == 2
    loadings = namespace["loadings"]
    assert isinstance(loadings, pd.DataFrame) and loadings["feature"].iloc[0] == 3
