"""The nvidia_driver role's decisions, from plain facts (GPU states come from handshaped_nvidia_smi_* fixtures)."""

from __future__ import annotations

import pytest
from handshaped_nvidia_smi import parse_handshaped

from twinspark import driver_plan, gpu
from twinspark.driver_plan import PlanError

UBUNTU_ARM64 = {"distribution": "Ubuntu", "distribution_version": "24.04", "architecture": "aarch64"}


def test_each_profile_has_its_default_mode():
    assert driver_plan.default_mode("gb10") == "verify"
    assert driver_plan.default_mode("cpu") == "skip"


def test_unknown_profile_names_the_variable_and_choices():
    with pytest.raises(PlanError, match=r"twinspark_profile must be one of gb10, cpu \(got 'gpu'\)"):
        driver_plan.default_mode("gpu")


@pytest.mark.parametrize("mode", ["verify", "install"])
def test_cpu_profile_refuses_to_drive_a_gpu(mode):
    with pytest.raises(PlanError, match=f"nvidia_driver_mode={mode} needs an NVIDIA GPU.*use nvidia_driver_mode=skip"):
        driver_plan.install_plan(profile="cpu", mode=mode, **UBUNTU_ARM64)


def test_install_refuses_dgx_os_whose_driver_comes_with_the_os():
    with pytest.raises(PlanError, match="runs DGX OS.*use nvidia_driver_mode=verify"):
        driver_plan.install_plan(profile="gb10", mode="install", dgx_os=True, **UBUNTU_ARM64)


def test_unknown_mode_is_refused():
    with pytest.raises(PlanError, match=r"nvidia_driver_mode must be one of verify, install, skip \(got 'upgrade'\)"):
        driver_plan.install_plan(profile="gb10", mode="upgrade", **UBUNTU_ARM64)


def test_skip_plan_does_nothing_and_says_why():
    plan = driver_plan.install_plan(profile="cpu", mode="skip")
    assert plan["repository"] is None
    assert plan["driver_packages"] == plan["toolkit_packages"] == plan["nccl_packages"] == []
    assert plan["skip_reason"].startswith("nvidia_driver_mode=skip (the default for twinspark_profile=cpu")


def test_skip_chosen_on_gb10_says_it_was_set_in_inventory():
    assert "(set in inventory)" in driver_plan.install_plan(profile="gb10", mode="skip")["skip_reason"]


def test_install_on_ubuntu_2404_arm64_uses_the_sbsa_repository_and_its_pinned_key():
    plan = driver_plan.install_plan(profile="gb10", mode="install", **UBUNTU_ARM64)
    repository = plan["repository"]
    assert repository["uri"] == "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/"
    assert repository["architecture"] == "arm64"
    assert (
        repository["key_url"] == "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/3bf863cc.pub"
    )
    assert repository["key_fingerprint"] == "EB693B3035CD5710E231E123A4B469963BF863CC"
    assert repository["keyring_path"] == "/etc/apt/keyrings/nvidia-cuda.asc"


def test_install_on_amd64_uses_the_x86_64_repository():
    plan = driver_plan.install_plan(
        profile="gb10", mode="install", distribution="Ubuntu", distribution_version="24.04", architecture="x86_64"
    )
    assert plan["repository"]["uri"].endswith("/ubuntu2404/x86_64/")
    assert plan["repository"]["architecture"] == "amd64"
    assert plan["nccl_library_path"] == "/usr/lib/x86_64-linux-gnu/libnccl.so.2"


def test_ubuntu_point_release_uses_its_release_repository():
    repository = driver_plan.cuda_repository("Ubuntu", "24.04.2", "aarch64")
    assert repository.uri.endswith("/ubuntu2404/sbsa/")


def test_install_packages_are_the_open_driver_of_the_branch_the_pinned_toolkit_and_nccl():
    plan = driver_plan.install_plan(profile="gb10", mode="install", branch=580, cuda_version="13.0", **UBUNTU_ARM64)
    assert plan["driver_packages"] == ["nvidia-driver-580-open"]
    assert plan["toolkit_packages"] == ["cuda-toolkit-13-0"]
    assert plan["nccl_packages"] == ["libnccl2", "libnccl-dev"]
    assert plan["nccl_library_path"] == "/usr/lib/aarch64-linux-gnu/libnccl.so.2"


def test_verify_installs_no_driver_but_still_the_os_nccl():
    plan = driver_plan.install_plan(profile="gb10", mode="verify", **UBUNTU_ARM64)
    assert plan["repository"] is None and plan["driver_packages"] == [] and plan["toolkit_packages"] == []
    assert plan["nccl_packages"] == ["libnccl2", "libnccl-dev"]
    assert plan["expected_gpu_name"] == "NVIDIA GB10"


def test_nccl_can_be_left_out():
    plan = driver_plan.install_plan(profile="gb10", mode="verify", nccl_install=False, **UBUNTU_ARM64)
    assert plan["nccl_packages"] == [] and plan["nccl_library_path"] == ""


def test_pinned_nccl_version_pins_library_and_headers_together():
    assert driver_plan.nccl_packages("2.28.7-1+cuda13.0") == [
        "libnccl2=2.28.7-1+cuda13.0",
        "libnccl-dev=2.28.7-1+cuda13.0",
    ]


def test_nccl_version_with_spaces_or_shell_text_is_refused():
    with pytest.raises(PlanError, match="nvidia_driver_nccl_version must be a Debian package version"):
        driver_plan.nccl_packages("2.28; rm -rf /")


@pytest.mark.parametrize(("written", "package"), [("13.0", "cuda-toolkit-13-0"), ("13-0", "cuda-toolkit-13-0")])
def test_cuda_version_accepts_both_spellings(written, package):
    assert driver_plan.cuda_toolkit_packages(written) == [package]


def test_bad_cuda_version_names_the_variable():
    with pytest.raises(PlanError, match=r"nvidia_driver_cuda_version must be MAJOR.MINOR such as 13.0 \(got '13'\)"):
        driver_plan.cuda_toolkit_packages("13")


@pytest.mark.parametrize(
    ("distribution", "version", "architecture", "message"),
    [
        ("Ubuntu", "22.04", "aarch64", "supports Ubuntu 24.04 \\(this node runs Ubuntu 22.04\\)"),
        ("Debian", "12", "aarch64", "this node runs Debian 12"),
        ("Ubuntu", "24.04", "ppc64le", "this node is ppc64le"),
    ],
)
def test_install_refuses_releases_nvidia_has_no_repository_for_here(distribution, version, architecture, message):
    with pytest.raises(PlanError, match=message):
        driver_plan.install_plan(
            profile="gb10",
            mode="install",
            distribution=distribution,
            distribution_version=version,
            architecture=architecture,
        )


DPKG_QUERY = "\n".join(
    [
        "nvidia-driver-580-open\t580.95.05-0ubuntu1\tii ",
        "libnvidia-compute-580\t580.95.05-0ubuntu1\tii ",
        "nvidia-kernel-source-580-open\t580.95.05-0ubuntu1\tii ",
        "nvidia-dkms-580-open\t580.95.05-0ubuntu1\tii ",
        "xserver-xorg-video-nvidia-580\t580.95.05-0ubuntu1\tii ",
        "nvidia-firmware-580-580.95.05\t580.95.05-0ubuntu1\tii ",
        "libnvidia-compute-570\t570.133.20-0ubuntu1\trc ",
        "cuda-toolkit-13-0\t13.0.2-1\tii ",
        "cuda-toolkit-12-8\t12.8.1-1\tii ",
        "libnccl2\t2.28.7-1+cuda13.0\tii ",
        "libnccl-dev\t2.28.7-1+cuda13.0\thi ",
        "nvidia-persistenced\t580.95.05-0ubuntu1\tii ",
        "bash\t5.2.21-2ubuntu4\tii ",
    ]
)


def test_dpkg_query_keeps_installed_and_held_packages_only():
    installed = driver_plan.parse_dpkg_query(DPKG_QUERY)
    assert installed["libnccl-dev"] == "2.28.7-1+cuda13.0"
    assert "libnvidia-compute-570" not in installed  # removed, config files remain


def test_holds_cover_the_whole_branch_the_toolkit_and_nccl_so_upgrades_cannot_split_them():
    installed = driver_plan.parse_dpkg_query(DPKG_QUERY)
    assert driver_plan.packages_to_hold(installed, branch=580, cuda_version="13.0", nccl=True) == [
        "cuda-toolkit-13-0",
        "libnccl-dev",
        "libnccl2",
        "libnvidia-compute-580",
        "nvidia-dkms-580-open",
        "nvidia-driver-580-open",
        "nvidia-kernel-source-580-open",
        "xserver-xorg-video-nvidia-580",
    ]


def test_holds_leave_nccl_alone_when_the_role_does_not_manage_it():
    installed = driver_plan.parse_dpkg_query(DPKG_QUERY)
    holds = driver_plan.packages_to_hold(installed, branch=580, cuda_version="13.0", nccl=False)
    assert "libnccl2" not in holds and "nvidia-driver-580-open" in holds


def test_a_branch_change_releases_the_old_branch_holds_only():
    installed = driver_plan.parse_dpkg_query(DPKG_QUERY + "\nnvidia-driver-570-open\t570.133.20-0ubuntu1\thi ")
    assert driver_plan.packages_to_release(installed, branch=580) == ["nvidia-driver-570-open"]
    assert driver_plan.packages_to_release(installed, branch=570)[:3] == [
        "libnvidia-compute-580",
        "nvidia-dkms-580-open",
        "nvidia-driver-580-open",
    ]


def test_installed_driver_branch_reads_the_driver_package():
    names = ["bash", "nvidia-driver-580-open", "nvidia-driver-575-server-open"]
    assert driver_plan.installed_driver_branch(names) == 580
    assert driver_plan.installed_driver_branch(["bash"]) is None


GPG_COLONS = """pub:-:4096:1:A4B469963BF863CC:1649870298:::-:::scESC::::::23::0:
fpr:::::::::EB693B3035CD5710E231E123A4B469963BF863CC:
uid:-::::1649870298::8E8A6D2D5B4F8B8B1B3E3A6C1F0A9B7C8D6E5F4A::cudatools <cudatools@nvidia.com>::::::::::0:
sub:-:4096:1:1E4E0A1B2C3D4E5F:1649870298::::::e::::::23:
fpr:::::::::0123456789ABCDEF0123456789ABCDEF01234567:
"""


def test_gpg_fingerprints_reads_primary_keys_only():
    assert driver_plan.gpg_fingerprints(GPG_COLONS) == ["EB693B3035CD5710E231E123A4B469963BF863CC"]


def assess_handshaped(case, loaded="580.95.05", installed="580.95.05", **overrides):
    options = {"required_branch": 580, "expected_gpu_name": "NVIDIA GB10", "require_persistence": True}
    options.update(overrides)
    return driver_plan.assess(
        parse_handshaped(case), loaded_module_version=loaded, installed_module_version=installed, **options
    )


def test_handshaped_gb10_on_580_with_persistence_passes_verify():
    assessment = assess_handshaped("gb10_driver_580")
    assert assessment.findings == () and not assessment.reboot_required
    assert driver_plan.next_step("verify", assessment, rebooted=False).action == "ok"


def test_handshaped_old_branch_is_a_finding_naming_the_required_branch():
    (finding,) = assess_handshaped("gb10_driver_575", loaded="575.57.08", installed="575.57.08").findings
    assert "runs driver 575.57.08, but TwinSpark needs branch 580 or newer (nvidia_driver_branch)" in finding


def test_handshaped_h100_on_gb10_profile_reports_wrong_gpu_and_old_branch():
    findings = assess_handshaped("h100_driver_570", loaded="570.133.20", installed="570.133.20").findings
    assert any("no NVIDIA GB10 visible (nvidia-smi lists 'NVIDIA H100 80GB HBM3')" in f for f in findings)
    assert any("needs branch 580" in f for f in findings)


def test_handshaped_persistence_off_is_a_finding_pointing_at_nvidia_persistenced():
    (finding,) = assess_handshaped("gb10_persistence_off").findings
    assert finding.startswith("persistence mode is off on GPU 0 (NVIDIA GB10)") and "nvidia-persistenced" in finding


def test_handshaped_persistence_off_passes_when_persistence_is_not_required():
    assert assess_handshaped("gb10_persistence_off", require_persistence=False).findings == ()


def test_handshaped_mismatch_needs_a_reboot_install_mode_reboots_it():
    assessment = assess_handshaped("version_mismatch", loaded="580.82.07", installed="580.95.05")
    assert assessment.reboot_required
    assert any("driver/library version mismatch" in reason for reason in assessment.reboot_reasons)
    assert any("loaded NVIDIA kernel module is 580.82.07 but the one installed" in r for r in assessment.reboot_reasons)
    step = driver_plan.next_step("install", assessment, rebooted=False)
    assert step.action == "reboot"


def test_handshaped_mismatch_in_verify_mode_fails_and_says_reboot_without_rebooting():
    step = driver_plan.next_step("verify", assess_handshaped("version_mismatch"), rebooted=False)
    assert step.action == "fail"
    assert step.message.startswith("this node needs a reboot: nvidia-smi reports a driver/library version mismatch")
    assert "nvidia_driver_mode=verify changes nothing" in step.message


def test_handshaped_mismatch_after_the_reboot_fails_instead_of_rebooting_again():
    step = driver_plan.next_step("install", assess_handshaped("version_mismatch"), rebooted=True)
    assert step.action == "fail" and "still not consistent after a reboot" in step.message


def test_handshaped_mismatch_with_reboots_disallowed_fails_with_the_reason():
    step = driver_plan.next_step("install", assess_handshaped("version_mismatch"), rebooted=False, reboot_allowed=False)
    assert step.action == "fail" and "nvidia_driver_reboot is false" in step.message


def test_handshaped_gb10_with_old_module_loaded_needs_a_reboot_even_though_nvidia_smi_works():
    assessment = assess_handshaped("gb10_driver_580", loaded="580.82.07", installed="580.95.05")
    assert assessment.reboot_reasons == (
        "the loaded NVIDIA kernel module is 580.82.07 but the one installed for this kernel is 580.95.05",
    )


def test_handshaped_unreachable_driver_with_fresh_module_not_loaded_needs_a_reboot():
    assessment = assess_handshaped("driver_unreachable", loaded=None, installed="580.95.05")
    assert assessment.reboot_reasons == ("the NVIDIA kernel module 580.95.05 is installed but not loaded",)


def test_handshaped_unreachable_driver_without_module_is_a_finding_not_a_reboot():
    assessment = assess_handshaped("driver_unreachable", loaded=None, installed=None)
    assert not assessment.reboot_required
    (finding,) = assessment.findings
    assert "no NVIDIA kernel module is installed for the running kernel" in finding and "dkms status" in finding


def test_missing_nvidia_smi_is_a_finding_naming_the_path():
    assessment = driver_plan.assess(
        gpu.missing_binary("/usr/bin/nvidia-smi"),
        loaded_module_version=None,
        installed_module_version=None,
        required_branch=580,
        expected_gpu_name="NVIDIA GB10",
        require_persistence=True,
    )
    (finding,) = assessment.findings
    assert finding.startswith("/usr/bin/nvidia-smi not found")


def test_handshaped_no_devices_is_a_finding():
    (finding,) = assess_handshaped("no_devices").findings
    assert "reports no GPU" in finding


def test_summary_of_handshaped_gb10():
    assert driver_plan.summary(parse_handshaped("gb10_driver_580")) == (
        "GPU 0 NVIDIA GB10, driver 580.95.05 (branch 580), persistence on"
    )


def test_the_recorded_h200_on_driver_580_passes_the_branch_rule_and_fails_only_for_not_being_a_gb10():
    """A real driver-580 output (fixtures/recorded_nvidia_smi_h200): the branch and persistence rules pass on it; the
    gb10 profile's verify still stops, naming the GPU nvidia-smi lists."""
    from test_gpu import _recorded

    from twinspark import gpu

    query = gpu.parse_query_output(*_recorded("h200"))
    (finding,) = driver_plan.assess(query, loaded_module_version="580.159.04", installed_module_version="580.159.04",
                                    required_branch=580, expected_gpu_name="NVIDIA GB10",
                                    require_persistence=True).findings
    assert "no NVIDIA GB10 visible (nvidia-smi lists 'NVIDIA H200')" in finding
    assessment = driver_plan.assess(query, loaded_module_version="580.159.04", installed_module_version="580.159.04",
                                    required_branch=580, expected_gpu_name="NVIDIA H200", require_persistence=True)
    assert assessment.findings == () and driver_plan.next_step("verify", assessment, rebooted=False).action == "ok"
