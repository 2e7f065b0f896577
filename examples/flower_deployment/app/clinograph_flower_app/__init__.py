"""Glue of the example deployment: how the server and each hospital are built from files.

:mod:`.server` -- the ServerApp's ``server-factory`` (runs on the SuperLink machine);
:mod:`.hospital` -- the SuperNode's ``--participant-factory`` (runs on each hospital machine);
:mod:`.prepare` -- writes demo hospital folders cut from the ALARM network (loopback demo).
"""
