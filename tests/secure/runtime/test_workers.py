"""The process transport: the in-process transport's answers from forked workers; a killed worker drops its hospitals."""

from __future__ import annotations

import os
import signal

import pytest
from clinograph.secure.runtime import InProcessTransport
from clinograph.secure.runtime.workers import ProcessTransport, WorkerError
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from clinograph.core.errors import ProtocolError


class Echo:
    """Answers a plan with its name and its process id."""

    def __init__(self, name: str):
        self.name = name

    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        return self.name.encode() + plan, str(os.getpid()).encode()


class Refuses(Echo):
    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        raise ProtocolError("this plan is not for me")


class Buggy(Echo):
    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        raise KeyError("patient 17")  # a foreign exception: its message must not travel


class Killed(Echo):
    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-exchange
        raise AssertionError("unreachable")


def hospitals(**kinds: type) -> dict:
    return {name: kind(name) for name, kind in kinds.items()}


def plan(names, round_=0):
    return {n: {"data": b"/p"} for n in names}


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_workers_answer_refuse_and_fail_as_the_in_process_transport_and_in_parallel_processes():
    kinds = {"a": Echo, "b": Refuses, "c": Buggy, "d": Echo}
    serial = InProcessTransport(hospitals(**kinds))
    serial.drop_at(0, {"d": 0})
    expected = serial.exchange("plan", plan(kinds), round_=0)
    with ProcessTransport(hospitals(**kinds), workers=2) as t:
        t.drop_at(0, {"d": 0})
        answers, failed = t.exchange("plan", plan(kinds), round_=0)
        pids = t.pids
        assert t.call(_name_and_pid) == {n: (n, pids[i % 2]) for i, n in enumerate("abcd")}
        assert answers["a"]["first"] == str(pids[0]).encode() != str(os.getpid()).encode()
        assert sorted(t.members()) == sorted(kinds)
    assert answers["a"]["report"] == expected[0]["a"]["report"] and set(answers) == set(expected[0]) == {"a"}
    assert failed == expected[1] and "ProtocolError" in failed["b"] and "KeyError" in failed["c"]
    assert "patient 17" not in failed["c"] and "silent" in failed["d"]
    assert all(gone(p) for p in pids)


def _name_and_pid(p: Echo) -> tuple[str, int]:
    return p.name, os.getpid()


def test_a_killed_worker_drops_its_hospitals_without_hanging_and_is_reaped():
    with ProcessTransport(hospitals(a=Echo, b=Killed, c=Echo), workers=2) as t:  # workers: [a, c] and [b]
        answers, failed = t.exchange("plan", plan("abc"), round_=0)
        assert set(answers) == {"a", "c"} and set(failed) == {"b"}
        assert "worker process ended (killed by signal 9)" in failed["b"]
        answers, failed = t.exchange("plan", plan("abc"), round_=1)  # the next exchange neither hangs
        assert set(answers) == {"a", "c"} and "killed by signal 9" in failed["b"]
        with pytest.raises(WorkerError, match=r"hospitals \['b'\] ended \(killed by signal 9\)"):
            t.call(_name_and_pid)
        pids = t.pids
    assert all(gone(p) for p in pids)


class KeepsASecret(Echo):
    """Holds a secret that refuses to be pickled (as a CKKS keyring does) and a TenSEAL context."""

    def __init__(self, name: str):
        super().__init__(name)
        import tenseal as ts

        from clinograph.core.identity import Identity

        self.secret = Identity.generate(name)
        self.context = ts.context(ts.SCHEME_TYPE.CKKS, 8192, coeff_mod_bit_sizes=[60, 40, 40, 60])
        self.round_key = X25519PrivateKey.generate()  # a masking round's key, as MaskingClient holds it
        self.peer = self.round_key.public_key()


def test_a_secret_or_a_tenseal_object_stays_in_its_worker_and_its_place_names_the_fix():
    built = hospitals(a=KeepsASecret, b=Echo)
    with ProcessTransport(built, workers=2) as t:
        back = t.members()
    assert back["a"].name == "a" and back["b"].name == "b"
    for attr, cls in (("secret", "Identity"), ("context", "Context"), ("round_key", "X25519PrivateKey")):
        withheld = getattr(back["a"], attr)
        assert repr(withheld) == f"Withheld({cls})"
        with pytest.raises(WorkerError, match=rf"{cls} stayed in its simulation worker.*workers = 1"):
            withheld.sign(b"x")
    assert back["a"] is not built["a"] and isinstance(back["a"].peer, X25519PublicKey)  # public keys travel
    assert back["a"].peer.public_bytes_raw() == built["a"].peer.public_bytes_raw()


def _closure(scale: float):
    def scaled(x: float) -> float:
        return scale * x
    return scaled


class HoldsClosures(Echo):
    """Holds a closure made before the fork (as a task's loss function) and makes one in its worker."""

    def __init__(self, name: str):
        super().__init__(name)
        self.before = _closure(2.0)
        self.after = None

    def on_plan(self, plan: bytes) -> tuple[bytes, bytes]:
        self.after = lambda x: x + 1
        return super().on_plan(plan)


def test_a_closure_made_before_the_fork_comes_back_as_itself_one_made_in_a_worker_as_withheld():
    hs = hospitals(a=HoldsClosures, b=Echo)
    before = hs["a"].before
    with ProcessTransport(hs, workers=2) as t:
        t.exchange("plan", plan("ab"), round_=0)
        back = t.members()
    assert back["a"].before is before and back["a"].before(3.0) == 6.0
    assert repr(back["a"].after).startswith("Withheld(function ")
    with pytest.raises(WorkerError, match="stayed in its simulation worker"):
        back["a"].after(1)


def test_a_masked_rounds_client_refuses_to_be_pickled_so_it_stays_in_its_worker():
    """Its pairwise keys and self-mask seed are bytes, which would otherwise travel as they are."""
    import pickle

    from clinograph.secure.masking.client import MaskingClient
    from clinograph.secure.runtime.workers import _class_stays

    with pytest.raises(TypeError, match="refuses to be pickled"):
        pickle.dumps(object.__new__(MaskingClient))
    assert _class_stays(MaskingClient)


FINALIZED: list[int] = []  # the pids in which a Cycle was finalized


class Cycle:
    """An object in a reference cycle whose finalizer notes where it ran (as a TenSEAL context's
    destructor would join a thread pool the fork did not copy)."""

    def __init__(self):
        self.me = self

    def __del__(self):
        FINALIZED.append(os.getpid())


class HoldsACycle(Echo):
    def __init__(self, name: str):
        super().__init__(name)
        self.cycle = Cycle()


def _drop_and_collect(participant) -> list[int]:
    import gc

    participant.cycle = None
    gc.collect()
    return [pid for pid in FINALIZED if pid == os.getpid()]


def test_a_worker_never_collects_what_it_inherited():
    """A TenSEAL context a hospital held at the fork, in a reference cycle, must not be collected in
    the worker: its destructor would join threads the fork did not copy (seen: a segfault)."""
    with ProcessTransport(hospitals(a=HoldsACycle, b=HoldsACycle), workers=2) as t:
        assert t.call(_drop_and_collect) == {"a": [], "b": []}
        assert t.call(_made_here_is_collected) == {"a": True, "b": True}  # what a worker makes is, as usual


def _made_here_is_collected(participant) -> bool:
    import gc

    participant.fresh = Cycle()
    participant.fresh = None
    gc.collect()
    return os.getpid() in FINALIZED
