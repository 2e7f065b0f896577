"""``run/finish`` (:meth:`SelectedRun.finish`): not sent to a hospital that went silent in the last round."""

from __future__ import annotations

from types import SimpleNamespace

from clinograph.secure.runtime.candidate import SelectedRun

from clinograph.core.identity import Identity

HOSPITALS = ("h1", "h2", "h3", "h4")


class _Recording:
    """A transport that reaches every hospital, records who each exchange went to and gets no answer."""

    defers_model = False

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[str]]] = []

    def hospitals(self) -> tuple[str, ...]:
        return HOSPITALS

    def exchange(self, stage, outgoing, *, round_):
        self.sent.append((stage, sorted(outgoing)))
        return {}, {n: "no reply to 'setup' within 1 s" for n in outgoing}


def test_run_finish_skips_the_hospitals_gone_silent_in_the_last_round_but_not_those_that_refused():
    server = SimpleNamespace(history=[SimpleNamespace(round=1)], round=2, enrolled=dict.fromkeys(HOSPITALS),
                             federation_id="fed-finish", identity=Identity.generate("server"))
    events: list[tuple[str, dict]] = []
    run = SelectedRun(candidate="c0", rounds=2, rule=None, on_event=lambda kind, data: events.append((kind, data)))
    run.after(server, SimpleNamespace(dropped={
        "h2": "stage 1: no reply to 'stage' within 20 s (timeout 20 s)",
        "h3": "refused at plan: PrivacyBudgetError: spent",
        "h4": "stage 1: error reply at 'stage': no reply to this, said the hospital's ClientApp"}))  # answered
    transport = _Recording()
    run.finish(server, transport, stopped=False)
    assert transport.sent == [("setup", ["h1", "h3", "h4"])]  # h3 refused, h4's ClientApp erred: alive, told
    reasons = {d["hospital"]: d["reason"] for kind, d in events if kind == "finish_not_delivered"}
    assert sorted(reasons) == list(HOSPITALS)  # nobody answered this transport; h2 was not even asked
    assert reasons["h2"].startswith("not sent: silent in the last round (stage 1: no reply")
    assert reasons["h1"].startswith("no reply to 'setup'")

    run.after(server, SimpleNamespace(dropped={}))  # a later round (the scoring round) h2 answered
    run.finish(server, transport, stopped=False)
    assert transport.sent[-1] == ("setup", list(HOSPITALS))


def test_went_silent_reads_only_the_transports_own_words():
    from clinograph.secure.runtime.transport import went_silent

    for silent in ("silent from exchange 2 ('stage')", "stage 1: not reachable in this process",
                   "plan: no reply to 'plan' within 600 s (timeout 600 s)"):
        assert went_silent(silent)
    for alive in ("refused at stage 1: no reply to anything", "answer to the plan lacks the report or the first message",
                  "stage 2: bad reply at 'stage': no reply to", "stage 1: sent a refusal that does not verify (x)"):
        assert not went_silent(alive)
