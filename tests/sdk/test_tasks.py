"""Tasks by registration: a miss lists the options, a config names only registered tasks, and a
registered task runs the one federation run (examples/write_a_task.py runs a whole one)."""

import pytest
from clinograph.sdk.config import HospitalConfig
from clinograph.sdk.tasks import create_task, register_task, registered_tasks

from clinograph.core.errors import RegistryError


def test_builtin_tasks_and_a_miss_that_lists_them():
    assert {"nsfl", "agat", "fednsl", "concepts"} <= set(registered_tasks())
    with pytest.raises(RegistryError, match=r"Unknown task 'nsfll'\. Registered: agat, concepts, fednsl, nsfl"):
        create_task("nsfll")


def test_a_config_names_a_registered_task_or_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"unknown task 'mine'; registered: .*register_task"):
        HospitalConfig.model_validate({"task": "mine"})
    register_task("mine", build=lambda *a, **k: None, modules=lambda *a, **k: None)
    try:
        assert HospitalConfig.model_validate({"task": "mine"}).task == "mine"
    finally:
        from clinograph.sdk import tasks as registry

        registry._TASKS.pop("mine")


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "x" * 65])
def test_task_names_are_checked(name):
    with pytest.raises(RegistryError, match="must start with a letter"):
        register_task(name, build=lambda *a, **k: None, modules=lambda *a, **k: None)


def test_the_initial_model_is_the_registered_tasks_modules():
    from clinograph.sdk.datasets.alarm import load_dictionary
    from clinograph.sdk.federation.build import initial_model_for

    d = load_dictionary()
    init = initial_model_for(HospitalConfig.model_validate({"model": {"hidden": 8}}), dictionary=d)
    mods = create_task("nsfl").modules(HospitalConfig.model_validate({"model": {"hidden": 8}}), dictionary=d)
    assert init.task == "nsfl" and init.spec.digest() == mods.spec(version=0).digest()
