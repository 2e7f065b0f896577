"""The release check's end of a run (sdk/model/release.py): the ``release`` / ``run_ended`` that
counts is the published round's own federation's, also when early elimination paused its run and
other candidates' runs ended in between."""

from clinograph.sdk.model.release import _end_of_federation


def e(kind, **payload):
    return {"kind": kind, "payload": payload}


def test_a_paused_run_s_end_is_its_own_not_another_candidate_s():
    other = [e("run_paused", rung=0), e("audit_open"), e("manifest", federation_id="fed-b"), e("release"),
             e("run_ended", status="completed"), e("audit_open"), e("candidates_eliminated")]
    resumed = [e("audit_open"), e("manifest", federation_id="fed-a"), e("run_resumed"), e("release"),
               e("run_ended", status="completed")]
    assert _end_of_federation(other + resumed, "fed-a") == "release"
    # eliminated: its run never resumed, another candidate's release is not its own
    assert _end_of_federation(other + [e("audit_open"), e("model_chosen")], "fed-a") is None
    # a run that ended without a release (failed before any round aggregated) is its own end
    assert _end_of_federation([e("run_ended", status="failed"), e("audit_open"),
                               e("manifest", federation_id="fed-a"), e("release")], "fed-a") == "run_ended"
