"""Every variant family is one registry (docs/architecture.md, "Registries"): each entry names an
object that imports, an unknown name is refused with the valid names listed, and a config field
made from the registry refuses it at validation time the same way, importing nothing."""
from __future__ import annotations

import argparse
import importlib

import pytest
from pydantic import TypeAdapter, ValidationError

from harnessrl.registry import DIALECT_ALIASES, resolve


def _obj(path: str):
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


#: family: (registry, what its errors call it, its own lookup or None for `registry.resolve`).
FAMILIES = {
    "harnesses": ("harnessrl.adapters:REGISTRY", "harness", "harnessrl.adapters:adapter_class"),
    "dialects": ("harnessrl.registry:DIALECTS", "dialect", "harnessrl.gym.proxy.dialects:dialect_module"),
    "sandbox backends": ("harnessrl.sandboxes:BACKENDS", "sandbox backend", "harnessrl.sandboxes:backend_class"),
    "generation backends": ("harnessrl.gym.backends:BACKENDS", "generation backend",
                            "harnessrl.gym.backends:backend_class"),
    "tool formats": ("harnessrl.gym.proxy.toolcalls:TOOL_FORMATS", "tool format", None),
    "trainers": ("harnessrl.trainers.base:TRAINERS", "trainer", "harnessrl.trainers.base:trainer_class"),
    "graders": ("harnessrl.gym.grading.score:GRADERS", "task format", None),
    "gold checks": ("harnessrl.gym.tasks.suites.check:CHECKS", "task format", None),
    "format specs": ("harnessrl.gym.tasks:SPECS", "task format spec", None),
    "reward kinds": ("harnessrl.gym.tasks:REWARDS", "reward kind", None),
    "task folders": ("harnessrl.gym.tasks.loaders:FOLDERS", "task folder format", None),
    "row layouts": ("harnessrl.gym.tasks.loaders:LAYOUTS", "task layout", None),
    "suites": ("harnessrl.gym.tasks.loaders:SUITES", "suite", None),
    "placements": ("harnessrl.gym.placement:PLACEMENTS", "placement", "harnessrl.gym.placement:placement_class"),
}

#: Config field types made from a registry: (type, registry, names it accepts besides the registry's).
FIELDS = {
    "HarnessName": ("harnessrl.adapters:HarnessName", "harnessrl.adapters:REGISTRY", ["x/y.toml", "a.b:C"]),
    "Dialect": ("harnessrl.registry:Dialect", "harnessrl.registry:DIALECTS", list(DIALECT_ALIASES)),
    "SandboxName": ("harnessrl.sandboxes:SandboxName", "harnessrl.sandboxes:BACKENDS", ["auto", "a.b:C"]),
    "BackendName": ("harnessrl.gym.backends:BackendName", "harnessrl.gym.backends:BACKENDS", ["a.b:C"]),
    "ToolFormatName": ("harnessrl.gym.proxy.toolcalls:ToolFormatName", "harnessrl.gym.proxy.toolcalls:TOOL_FORMATS",
                       ["a.b:C"]),
    "TrainerName": ("harnessrl.trainers.base:TrainerName", "harnessrl.trainers.base:TRAINERS", ["a.b:C"]),
    "PlacementName": ("harnessrl.gym.placement:PlacementName", "harnessrl.gym.placement:PLACEMENTS", ["a.b:C"]),
}


def _lookup(family: str):
    registry, what, own = FAMILIES[family]
    if own is not None:
        return _obj(own)
    return lambda name: resolve(_obj(registry), name, what)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_entry_names_an_object_that_imports(family):
    registry = _obj(FAMILIES[family][0])
    assert registry and all(isinstance(k, str) and ":" in v for k, v in registry.items())
    for name in registry:
        assert _lookup(family)(name) is not None, f"{family}: {name!r}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_an_unknown_name_lists_the_valid_ones(family):
    registry, what, _ = FAMILIES[family]
    with pytest.raises((ValueError, KeyError)) as e:
        _lookup(family)("no-such-thing")
    message = str(e.value)
    assert f"unknown {what} 'no-such-thing'" in message
    assert all(name in message for name in _obj(registry)), message


@pytest.mark.parametrize("field", sorted(FIELDS))
def test_a_config_field_refuses_an_unknown_name_listing_the_valid_ones(field):
    kind, registry, more = FIELDS[field]
    adapter = TypeAdapter(_obj(kind))
    for name in [*_obj(registry), *more]:
        adapter.validate_python(name)
    with pytest.raises(ValidationError) as e:
        adapter.validate_python("no-such-thing")
    assert all(name in str(e.value) for name in _obj(registry)), str(e.value)


def test_old_dialect_spellings_read_as_the_one_name():
    adapter = TypeAdapter(_obj("harnessrl.registry:Dialect"))
    assert {old: adapter.validate_python(old) for old in DIALECT_ALIASES} == {
        "openai_chat": "openai-chat", "openai_responses": "openai-responses", "anthropic_messages": "anthropic"}


def test_the_sandbox_flag_refuses_an_unknown_backend_listing_the_valid_ones():
    from harnessrl.sandboxes import sandbox_arg

    assert sandbox_arg("local") == "local" and sandbox_arg("pkg.mod:Backend") == "pkg.mod:Backend"
    with pytest.raises(argparse.ArgumentTypeError, match="valid: auto, docker, local"):
        sandbox_arg("podman")


def test_a_train_config_names_its_trainer_and_a_tinker_section_still_means_tinker():
    from pathlib import Path

    from harnessrl.trainers.train_config import TrainConfig, load_config

    assert TrainConfig().trainer_name == "torch"
    hosted = load_config(Path(__file__).resolve().parents[1] / "examples" / "tinker" / "train-hosted.toml")
    assert hosted.tinker is not None and hosted.trainer_name == "tinker"
    with pytest.raises(ValidationError, match="trainer_name"):
        TrainConfig(trainer_name="tinker")
    with pytest.raises(ValidationError, match="known: tinker, torch"):
        TrainConfig(trainer_name="jax")


def test_every_harness_speaks_a_registered_dialect():
    from harnessrl.adapters import REGISTRY, adapter_class
    from harnessrl.registry import DIALECTS

    speaks = {name: getattr(adapter_class(name), "dialect", None) for name in REGISTRY if name != "command"}
    assert all(d in DIALECTS for d in speaks.values()), speaks
