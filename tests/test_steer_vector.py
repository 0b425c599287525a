"""Steering along a given vector at any site (`rnr steer --vector FILE.pt --site NAME`)."""

from __future__ import annotations

import pytest
import torch
import typer
from typer.testing import CliRunner

from rnr_interp.analyses.localise.steering import run_steer
from rnr_interp.commands.localise import steer as steer_command
from rnr_interp.engine.sampling import deployed_decoding
from rnr_interp.models import load_model
from rnr_interp.records import RunDir


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-llama:2")


def test_a_given_vector_is_steered_at_its_site_on_the_held_out_parts(tmp_path, lm):
    from tests.test_repair import parity_task

    t = parity_task(40)
    vector = torch.linspace(-1, 1, lm.bridge.cfg.d_model)
    s = run_steer(lm, t, tmp_path / "s", alphas=(0.0, 8.0), panel=6, decoding=deployed_decoding(t, max_new_tokens=3),
                  progress=False, vector=vector, site="blocks.1.hook_resid_mid")
    assert s.skipped is None, s.skipped
    run = RunDir(tmp_path / "s")
    assert run.config["site"] == "hook_resid_mid" and run.config["vector"]["size"] == lm.bridge.cfg.d_model
    assert run.config["layer"] == 1 and not list(run.path.glob("repair*"))  # no block chosen by a sweep
    given = run.read_json("direction")
    assert given["from"] == "given" and given["site"] == "hook_resid_mid"
    assert torch.allclose(torch.tensor(given["vector"]), vector)
    steered = run.read_records().query("probe.str.startswith('steer:')")
    assert steered["intervention"].str.startswith("steer:1:hook_resid_mid:").all()
    assert set(run.read_table("steering")["alpha"]) == {0.0, 8.0}


@pytest.mark.parametrize("vector,options,message", [
    (torch.ones(5), ["--layer", "1"], "has 5 numbers but blocks.1.hook_mlp_out has 64"),
    (torch.ones(64), ["--site", "hook_resid_mid"], "needs its block"),
    (torch.ones(64), ["--site", "blocks.1.hook_nowhere"], "unknown site"),
    (torch.ones(64), ["--site", "blocks.1.hook_resid_mid", "--layer", "0"], "is in block 1, but --layer is 0"),
    (torch.ones(2, 64), ["--layer", "1"], "one finite row"),
    ({"v": torch.ones(64)}, ["--layer", "1"], "holds a dict, not a tensor"),
    (None, ["--layer", "1"], "no such file"),
])
def test_steer_refuses_a_bad_vector_or_site_in_one_line(tmp_path, vector, options, message):
    app = typer.Typer()
    app.command("steer")(steer_command)
    app.command("other")(lambda: None)
    path = tmp_path / "v.pt"
    if vector is not None:
        torch.save(vector, path)
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["steer", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "4", "--quiet",
                                   "--vector", str(path), *options, "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert message in res.output and res.output.count("\n") == 1
    assert not out.exists()


def test_a_site_without_a_vector_is_refused(tmp_path):
    app = typer.Typer()
    app.command("steer")(steer_command)
    app.command("other")(lambda: None)
    res = CliRunner().invoke(app, ["steer", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "4", "--quiet",
                                   "--site", "hook_resid_mid", "--layer", "1", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "needs a given vector" in res.output
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_not_a_tensor_file_is_refused(tmp_path):
    app = typer.Typer()
    app.command("steer")(steer_command)
    app.command("other")(lambda: None)
    path = tmp_path / "v.pt"
    path.write_text("not a tensor")
    res = CliRunner().invoke(app, ["steer", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "4", "--quiet",
                                   "--vector", str(path), "--layer", "1", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2 and "is not a tensor saved with torch.save" in res.output, res.output


def test_the_command_records_the_vector_and_its_site(tmp_path):
    app = typer.Typer()
    app.command("steer")(steer_command)
    app.command("other")(lambda: None)
    path = tmp_path / "v.pt"
    torch.save(torch.linspace(-1, 1, 64), path)
    res = CliRunner().invoke(app, ["steer", "--model", "tiny-llama:2", "--task", "arithmetic_mc", "--n", "6", "--panel", "3",
                                   "--max-new-tokens", "3", "--quiet", "--alphas", "0,4", "--vector", str(path),
                                   "--site", "blocks.1.hook_resid_mid", "--out", str(tmp_path / "s")])
    assert res.exit_code == 0, res.output
    run = RunDir(tmp_path / "s")
    assert (run.config["site"], run.config["layer"], run.config["vector"]["size"]) == ("hook_resid_mid", 1, 64)
