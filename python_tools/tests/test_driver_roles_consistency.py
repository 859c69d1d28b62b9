"""The driver roles agree with the settings registry and document every variable they default."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from twinspark import driver_plan, settings

ROLES = Path(__file__).resolve().parents[2] / "roles"


def test_every_registry_profile_has_a_driver_mode_and_no_other():
    assert set(settings.load()["TWINSPARK_PROFILE"].choices) == set(driver_plan.DEFAULT_MODE)


def test_roles_fall_back_to_the_registrys_default_profile():
    """The roles read twinspark_layout_profile, which role twinspark_layout defaults to the registry's profile."""
    registry_default = settings.load()["TWINSPARK_PROFILE"].default
    layout_defaults = yaml.safe_load((ROLES / "twinspark_layout/defaults/main.yml").read_text())
    assert layout_defaults["twinspark_layout_profile"] == f"{{{{ twinspark_profile | default('{registry_default}') }}}}"
    for path in (ROLES / "nvidia_driver/defaults/main.yml", ROLES / "nvidia_driver/vars/main.yml"):
        assert "twinspark_layout_profile" in path.read_text() and "twinspark_profile |" not in path.read_text()


def test_vllm_loads_by_default_the_nccl_library_the_role_installs_on_a_spark():
    knob = settings.load()["VLLM_NCCL_SO_PATH"]
    assert knob.var == "twinspark_vllm_nccl_so_path"
    assert knob.default_for("gb10") == driver_plan.nccl_library_path("aarch64")


@pytest.mark.parametrize("role", ["nvidia_driver", "node_hygiene"])
def test_argument_specs_cover_exactly_the_role_defaults(role):
    defaults = yaml.safe_load((ROLES / role / "defaults/main.yml").read_text())
    specs = yaml.safe_load((ROLES / role / "meta/argument_specs.yml").read_text())
    assert set(specs["argument_specs"]["main"]["options"]) == set(defaults)
