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


def test_any_method_chooses_a_configuration_with_options_and_names_them(tmp_path):
    # A configuration with options (Top-k at 1% in 8-bit values, here in
    # 900 steps, fewer than any other) is a candidate like any other when
    # method=None, and the result names its options.
    path = tmp_path / "profile.json"
    profile = json.loads(open(_profile(path)).read())
    int8 = dict(profile["runs"][3], options="values=int8",
                curve=[[450, 2.0, None], [900, 1.0, None], [4000, 0.5, None]])
    profile["runs"].append(int8)
    path.write_text(json.dumps(profile))
    model = torch.nn.Linear(1000, 1000)
    best = sparsecomm.choose_density(str(path), model, None, link_gbit=1, target_loss=1.0)
    assert best["configuration"] == "topk c=0.01 (values=int8)"
    assert best["options"] == "values=int8"
    assert best["steps"] == 900
    # A named method keeps its options filter: "" means the defaults.
    topk = sparsecomm.choose_density(str(path), model, "topk", link_gbit=1, target_loss=1.0)
    assert topk["options"] == "" and topk["steps"] == 1400


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


def test_pilot_runs_of_ones_own_loop_make_a_profile_that_chooses(tmp_path):
    # Two pilots of a loop of one's own: ExDyna at 1% reaches loss 1.0 in
    # 1,000 steps, at 0.1% in 2,000; on a slow link the sparser one wins.
    runs = []
    for density, reach in ((0.01, 1000), (0.001, 2000)):
        run = sparsecomm.PilotRun("exdyna", density, seed=1, steps=3000)
        for step in range(0, 3001, 500):
            run.record(step, test_loss=2.0 - step / reach if step <= reach else 1.0 - step * 1e-5,
                       test_accuracy=min(1.0, step / 3000))
        runs.append(run)
    path = tmp_path / "mine.json"
    sparsecomm.write_convergence_profile(path, runs, model="mine", ranks=4, batch=32,
                                         compute_s=0.05)
    model = torch.nn.Linear(1000, 1000)
    slow = sparsecomm.choose_density(str(path), model, "exdyna", link_gbit=0.001,
                                     target_loss=1.0)
    assert slow["density"] == 0.001
    assert slow["steps"] == pytest.approx(2000)
    assert json.loads(path.read_text())["runs"][0]["curve"][1] == [500, 1.5, 500 / 3000]


def test_a_malformed_profile_is_not_written(tmp_path):
    run = sparsecomm.PilotRun("exdyna", 0.01, seed=1, steps=100)
    run.record(10, test_loss=1.0, test_accuracy=91.5)  # a percentage, not a fraction
    path = tmp_path / "bad.json"
    with pytest.raises(ValueError, match="not a fraction in"):
        sparsecomm.write_convergence_profile(path, [run], model="mine", ranks=4, batch=32,
                                             compute_s=0.05)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary left behind
    with pytest.raises(ValueError, match="'runs' must be a non-empty array"):
        sparsecomm.write_convergence_profile(path, [], model="mine", ranks=4, batch=32,
                                             compute_s=0.05)


def test_a_calibrated_network_profile_chooses_as_its_link_rate_does(tmp_path):
    profile = _profile(tmp_path / "profile.json")
    model = torch.nn.Linear(1000, 1000)
    # A cost profile as `sparsecomm calibrate` writes one, of a 1 Mbit/s link
    # (8 us a byte) with 50 us of latency and no host costs.
    network = tmp_path / "network.json"
    network.write_text(json.dumps({
        "name": "slow", "alpha_s": 50e-6, "beta_s_per_byte": 8e-6, "gamma_s_per_element": 0.0,
        "accumulate_s_per_element": 0.0, "update_s_per_element": 0.0,
        "select_s_per_element": {}}))
    slow = sparsecomm.choose_density(profile, model, "exdyna", network_profile=network,
                                     target_loss=1.0)
    assert slow["density"] == 0.001
    # A compute of a minute a step drowns the exchange: the fewest steps win.
    slowest = sparsecomm.choose_density(profile, model, "exdyna", network_profile=network,
                                        target_loss=1.0, compute_s=60.0)
    assert slowest["density"] == 0.1
    assert slowest["step_s"] >= 60.0
    with pytest.raises(ValueError, match="not both or neither"):
        sparsecomm.choose_density(profile, model, link_gbit=1, network_profile=network,
                                  target_loss=1.0)
    with pytest.raises(ValueError, match="not both or neither"):
        sparsecomm.choose_density(profile, model, target_loss=1.0)
    with pytest.raises(ValueError, match="cannot read the cost profile"):
        sparsecomm.choose_density(profile, model, network_profile=tmp_path / "missing.json",
                                  target_loss=1.0)
    with pytest.raises(ValueError, match="compute_s must be a time > 0"):
        sparsecomm.choose_density(profile, model, link_gbit=1, target_loss=1.0, compute_s=0)
