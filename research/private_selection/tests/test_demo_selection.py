"""The demo's DP federation with and without private selection (research/private_selection/demo_selection.py):
the two arms are the demo's config and differ only by selection, whose σ covers the scoring rounds."""

import pytest

pytest.importorskip("lifelines")


def test_the_arms_are_the_demo_dp_config_and_differ_only_by_selection(tmp_path, monkeypatch):
    import clinograph.sdk.demo.run as demo_run
    from clinograph.sdk.federation.candidates import distributed_rounds

    from research.private_selection.demo_selection import ARMS
    from research.private_selection.validation_choice import demo_config

    monkeypatch.setattr(demo_run, "distributed_sigma", lambda cfg, **_: float(distributed_rounds(cfg)))
    off, on = (demo_config(ARMS[a], 0, epsilon=10.0, tables=[None] * 4, dictionary=None, work=tmp_path / a)
               for a in ("off", "on"))
    assert not off.hospital_config().selection_active() and on.hospital_config().selection_active()
    assert on.selection.candidates == () and on.selection.enabled is True
    assert (off.privacy.noise_multiplier, on.privacy.noise_multiplier) == (60.0, 62.0)  # + the scoring rounds
    same = ("federation", "model", "split", "graph")
    assert all(getattr(off, k) == getattr(on, k) for k in same) and off.model.deep is True
    assert off.privacy.model_copy(update={"noise_multiplier": 0, "state_dir": None}) == \
        on.privacy.model_copy(update={"noise_multiplier": 0, "state_dir": None})
