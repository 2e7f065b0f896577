"""The hospital side of a federation: the task interface, the one client, the one builder, simulation.

- :mod:`.task` -- what a hospital trains (:class:`Task`); :mod:`.nsfl_task` -- NS-FL.
- :mod:`.client` -- :class:`HospitalClient`, the hospital in every round, over any task.
- :mod:`.build` -- :func:`build_hospital`, the only place a hospital is assembled.
- :mod:`.split` -- the train/validation/test rule (by hospital name, not config order).
- :mod:`.simulate` -- a whole federation in one process over the in-process transport.
"""
