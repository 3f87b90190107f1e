"""choose_density: train's --density auto for a loop of one's own, on a
convergence profile written here (the file `sparsecomm convergence` makes)."""

import json

import pytest
import torch

import sparsecomm


def _profile(path):
    # ExDyna reaches loss 1.0 in 3,000 steps at 0.1%, 1,500 at 1%, 1,100 at
    # 10%; Top-k at 1% in 1,400 steps; a 4-rank profile of a 1M-parameter model.
    def run(method, density, steps):
        return {"method": method, "density": density, "local_steps": 0, "overlap": False,
                "options": "", "seed": 1, "steps": 4000,
                "curve": [[steps // 2, 2.0, None], [steps, 1.0, None], [4000, 0.5, None]]}
    profile = {"format": "sparsecomm convergence profile", "version": 1, "model": "mine",
               "ranks": 4, "batch": 32, "compute_s": 0.05, "schedule": "test",
               "source": "test_planning.py",
               "runs": [run("exdyna", 0.001, 3000), run("exdyna", 0.01, 1500),
                        run("exdyna", 0.1, 1100), run("topk", 0.01, 1400)]}
    path.write_text(json.dumps(profile))
    return str(path)


def test_a_slow_link_picks_a_sparser_density_than_a_fast_one(tmp_path):
    profile = _profile(tmp_path / "profile.json")
    model = torch.nn.Linear(1000, 1000)  # 1,001,000 parameters
    fast = sparsecomm.choose_density(profile, model, "exdyna", link_gbit=100, target_loss=1.0)
    slow = sparsecomm.choose_density(profile, model, "exdyna", link_gbit=0.001, target_loss=1.0)
    assert fast["method"] == slow["method"] == "exdyna"
    assert slow["density"] < fast["density"]
    assert slow["density"] == 0.001
    assert slow["steps"] == 3000
    assert slow["time_s"] == pytest.approx(slow["steps"] * slow["step_s"])
    assert slow["configuration"] == "exdyna c=0.001"
    # Any method (method=None): the profile's fastest on this link.
    best = sparsecomm.choose_density(profile, model, None, link_gbit=100, target_loss=1.0)
    assert best["time_s"] <= fast["time_s"]


def test_what_cannot_be_chosen_is_refused(tmp_path):
    profile = _profile(tmp_path / "profile.json")
    model = torch.nn.Linear(10, 10)
    with pytest.raises(ValueError, match="no configuration of micro"):
        sparsecomm.choose_density(profile, model, "micro", link_gbit=1, target_loss=1.0)
    with pytest.raises(ValueError, match="needs one target"):
        sparsecomm.choose_density(profile, model, link_gbit=1)
    with pytest.raises(ValueError, match="link rate"):
        sparsecomm.choose_density(profile, model, link_gbit=0, target_loss=1.0)
    with pytest.raises(ValueError, match="cannot read the convergence profile"):
        sparsecomm.choose_density(str(tmp_path / "missing.json"), model, link_gbit=1,
                                  target_loss=1.0)
