"""What the `nvidia_driver` role does on a node, decided from facts (pure functions, no I/O).

The role gathers facts (distribution, architecture, nvidia-smi output, kernel module versions, installed packages) and
hands them to the filters in `filter_plugins/twinspark_driver.py`, which call the functions here. So every decision
(mode per profile, which packages, which repository and key, what to hold, when to reboot, what verify reports) is
unit-tested with plain data.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from twinspark.gpu import GpuQuery, driver_branch

PROFILES = ("gb10", "cpu")
MODES = ("verify", "install", "skip")

# gb10: DGX OS ships the driver, so only verify it; cpu: the simulated pair has no NVIDIA GPU.
DEFAULT_MODE = {"gb10": "verify", "cpu": "skip"}
EXPECTED_GPU_NAME = {"gb10": "NVIDIA GB10"}

CUDA_REPO_BASE_URL = "https://developer.download.nvidia.com/compute/cuda/repos"
# NVIDIA's CUDA repository key (short id 3bf863cc), published at each repository's root.
CUDA_REPO_KEY_FILE = "3bf863cc.pub"
CUDA_REPO_KEY_FINGERPRINT = "EB693B3035CD5710E231E123A4B469963BF863CC"

# Distribution releases the install mode supports, as NVIDIA names their repository directories.
SUPPORTED_RELEASES = {("ubuntu", "24.04"): "ubuntu2404"}
# Architecture as Ansible or dpkg reports it -> (dpkg architecture, NVIDIA repository directory, multiarch triplet).
ARCHITECTURES = {
    "aarch64": ("arm64", "sbsa", "aarch64-linux-gnu"),
    "arm64": ("arm64", "sbsa", "aarch64-linux-gnu"),
    "x86_64": ("amd64", "x86_64", "x86_64-linux-gnu"),
    "amd64": ("amd64", "x86_64", "x86_64-linux-gnu"),
}

NCCL_PACKAGES = ("libnccl2", "libnccl-dev")


class PlanError(ValueError):
    """Inventory or node facts the role can't act on; the message names the variable and the fix."""


@dataclass(frozen=True)
class Repository:
    """NVIDIA's CUDA apt repository for one distribution release and architecture (a flat repository: suite "/")."""

    name: str
    uri: str
    architecture: str
    key_url: str
    key_fingerprint: str
    keyring_path: str


@dataclass(frozen=True)
class Assessment:
    """What the probed driver state means: reasons to reboot, and findings a reboot would not fix."""

    reboot_reasons: tuple[str, ...]
    findings: tuple[str, ...]

    @property
    def reboot_required(self) -> bool:
        return bool(self.reboot_reasons)


@dataclass(frozen=True)
class Step:
    """What the role does next: "ok", "reboot" or "fail", with the message it prints."""

    action: str
    message: str


def default_mode(profile: str) -> str:
    """The mode the role uses when inventory doesn't set nvidia_driver_mode."""
    try:
        return DEFAULT_MODE[profile]
    except KeyError:
        raise PlanError(
            f"twinspark_profile must be one of {', '.join(PROFILES)} (got {profile!r}): set it in the inventory's "
            "group_vars (gb10 for DGX Spark hardware, cpu for the simulated pair)"
        ) from None


def check_mode(profile: str, mode: str, *, dgx_os: bool = False) -> None:
    """Refuse combinations that would do harm: installing onto DGX OS, or driving a GPU the cpu profile lacks."""
    default_mode(profile)
    if mode not in MODES:
        raise PlanError(f"nvidia_driver_mode must be one of {', '.join(MODES)} (got {mode!r})")
    if profile == "cpu" and mode != "skip":
        raise PlanError(
            f"nvidia_driver_mode={mode} needs an NVIDIA GPU, but twinspark_profile=cpu has none: "
            "use nvidia_driver_mode=skip (the cpu default)"
        )
    if mode == "install" and dgx_os:
        raise PlanError(
            "nvidia_driver_mode=install is for plain Ubuntu 24.04, but this node runs DGX OS (/etc/dgx-release), "
            "whose driver, CUDA and NCCL come with the OS: use nvidia_driver_mode=verify (the gb10 default)"
        )


def skip_reason(profile: str, mode: str) -> str:
    """The one line the role prints in skip mode."""
    why = (
        f"the default for twinspark_profile={profile}, which has no NVIDIA GPU"
        if DEFAULT_MODE.get(profile) == "skip"
        else "set in inventory"
    )
    return f"nvidia_driver_mode={mode} ({why}): the NVIDIA driver, CUDA and NCCL are left alone on this node"


def cuda_repository(
    distribution: str,
    version: str,
    architecture: str,
    *,
    base_url: str = CUDA_REPO_BASE_URL,
    keyring_dir: str = "/etc/apt/keyrings",
) -> Repository:
    """NVIDIA's CUDA repository for this node: ubuntu2404/sbsa on arm64 (DGX Spark), ubuntu2404/x86_64 on amd64."""
    major_minor = ".".join(str(version).split(".")[:2])  # 24.04.1 is still 24.04
    release = SUPPORTED_RELEASES.get((distribution.lower(), major_minor))
    if release is None:
        supported = ", ".join(f"{name.capitalize()} {number}" for name, number in SUPPORTED_RELEASES)
        raise PlanError(
            f"nvidia_driver_mode=install supports {supported} (this node runs {distribution} {version}): "
            "install the driver by hand, or use nvidia_driver_mode=verify once it is installed"
        )
    if architecture not in ARCHITECTURES:
        raise PlanError(
            f"nvidia_driver_mode=install supports the architectures {', '.join(sorted(ARCHITECTURES))} "
            f"(this node is {architecture})"
        )
    deb_architecture, repo_directory, _ = ARCHITECTURES[architecture]
    uri = f"{base_url.rstrip('/')}/{release}/{repo_directory}/"
    return Repository(
        name="nvidia-cuda",
        uri=uri,
        architecture=deb_architecture,
        key_url=uri + CUDA_REPO_KEY_FILE,
        key_fingerprint=CUDA_REPO_KEY_FINGERPRINT,
        keyring_path=f"{keyring_dir.rstrip('/')}/nvidia-cuda.asc",
    )


def driver_packages(branch: int) -> list[str]:
    """The open kernel module driver of the branch (GB10 needs the open modules)."""
    return [f"nvidia-driver-{int(branch)}-open"]


def cuda_toolkit_packages(cuda_version: str) -> list[str]:
    """The pinned toolkit metapackage: '13.0' or '13-0' -> cuda-toolkit-13-0."""
    match = re.fullmatch(r"\s*(\d+)[.-](\d+)\s*", str(cuda_version))
    if not match:
        raise PlanError(f"nvidia_driver_cuda_version must be MAJOR.MINOR such as 13.0 (got {cuda_version!r})")
    return [f"cuda-toolkit-{match.group(1)}-{match.group(2)}"]


def nccl_packages(nccl_version: str = "") -> list[str]:
    """libnccl2 and its headers, at one exact version when given (both must match, apt refuses otherwise)."""
    version = str(nccl_version or "").strip()
    if version and not re.fullmatch(r"[0-9][A-Za-z0-9.+~:-]*", version):
        raise PlanError(
            f"nvidia_driver_nccl_version must be a Debian package version such as 2.28.7-1+cuda13.0, "
            f"or empty for the repository's newest (got {nccl_version!r})"
        )
    return [f"{name}={version}" if version else name for name in NCCL_PACKAGES]


def nccl_library_path(architecture: str) -> str:
    """Where the OS's libnccl2 puts the library vLLM should load (VLLM_NCCL_SO_PATH)."""
    if architecture not in ARCHITECTURES:
        raise PlanError(f"no NCCL library path known for architecture {architecture!r}")
    return f"/usr/lib/{ARCHITECTURES[architecture][2]}/libnccl.so.2"


def install_plan(
    *,
    profile: str,
    mode: str,
    distribution: str = "",
    distribution_version: str = "",
    architecture: str = "",
    dgx_os: bool = False,
    branch: int = 580,
    cuda_version: str = "13.0",
    nccl_install: bool = True,
    nccl_version: str = "",
    repo_base_url: str = CUDA_REPO_BASE_URL,
    keyring_dir: str = "/etc/apt/keyrings",
) -> dict:
    """Everything the role's install, NCCL and verify tasks need, as plain data (the filter's output)."""
    check_mode(profile, mode, dgx_os=dgx_os)
    plan: dict = {
        "mode": mode,
        "skip_reason": skip_reason(profile, mode) if mode == "skip" else "",
        "repository": None,
        "driver_packages": [],
        "toolkit_packages": [],
        "nccl_packages": [],
        "nccl_library_path": "",
        "expected_gpu_name": EXPECTED_GPU_NAME.get(profile, ""),
        "branch": int(branch),
    }
    if mode == "skip":
        return plan
    if mode == "install":
        repository = cuda_repository(
            distribution, distribution_version, architecture, base_url=repo_base_url, keyring_dir=keyring_dir
        )
        plan["repository"] = asdict(repository)
        plan["driver_packages"] = driver_packages(branch)
        plan["toolkit_packages"] = cuda_toolkit_packages(cuda_version)
    plan["multiarch"] = ARCHITECTURES[architecture][2] if architecture in ARCHITECTURES else ""
    if nccl_install:
        plan["nccl_packages"] = nccl_packages(nccl_version)
        plan["nccl_library_path"] = nccl_library_path(architecture)
    return plan


def parse_dpkg_query(text: str) -> dict[str, str]:
    """Installed packages from `dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'`."""
    installed = {}
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) >= 3 and fields[2].strip()[1:2] == "i":
            installed[fields[0].strip()] = fields[1].strip()
    return installed


def installed_driver_branch(installed: Iterable[str]) -> int | None:
    """The branch of the installed nvidia-driver-<branch>[-server][-open] package (the newest if several)."""
    branches = [
        int(match.group(1))
        for name in installed
        if (match := re.fullmatch(r"nvidia-driver-(\d+)(?:-server)?(?:-open)?", name))
    ]
    return max(branches) if branches else None


def packages_to_hold(installed: Iterable[str], *, branch: int, cuda_version: str, nccl: bool) -> list[str]:
    """Every installed package of the driver branch, the toolkit metapackage and NCCL.

    Holding only nvidia-driver-<branch>-open is not enough: an unattended upgrade of its dependencies (for example
    libnvidia-compute-<branch>) replaces the user-space library under a running kernel module, and nvidia-smi then
    fails with "Driver/library version mismatch" until the node reboots.
    """
    wanted = set(cuda_toolkit_packages(cuda_version)) | (set(NCCL_PACKAGES) if nccl else set())
    return sorted(name for name in installed if _package_branch(name) == int(branch) or name in wanted)


def packages_to_release(installed: Iterable[str], *, branch: int) -> list[str]:
    """Installed packages of any other driver branch: unheld before a branch change, so apt may replace them."""
    return sorted(name for name in installed if _package_branch(name) not in (None, int(branch)))


_BRANCH_PACKAGE = re.compile(
    r"(?:lib)?nvidia-[a-z0-9-]*?-(\d{3,})(?:-server)?(?:-open)?|xserver-xorg-video-nvidia-(\d{3,})"
)


def _package_branch(name: str) -> int | None:
    """The driver branch a package belongs to by its name (libnvidia-compute-580 -> 580), else None."""
    match = _BRANCH_PACKAGE.fullmatch(name)
    return int(match.group(1) or match.group(2)) if match else None


def gpg_fingerprints(colons_output: str) -> list[str]:
    """Primary-key fingerprints from `gpg --show-keys --with-colons` (the fpr line after each pub line)."""
    fingerprints = []
    expecting = False
    for line in colons_output.splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            expecting = True
        elif fields[0] == "fpr" and expecting and len(fields) > 9:
            fingerprints.append(fields[9].upper())
            expecting = False
    return fingerprints


def assess(
    query: GpuQuery,
    *,
    loaded_module_version: str | None,
    installed_module_version: str | None,
    required_branch: int,
    expected_gpu_name: str,
    require_persistence: bool,
) -> Assessment:
    """Judge the probed state: what a reboot would fix, and what it would not."""
    loaded = (loaded_module_version or "").strip() or None
    installed = (installed_module_version or "").strip() or None
    reboot_reasons: list[str] = []
    findings: list[str] = []

    if query.status == "version_mismatch":
        reboot_reasons.append(f"nvidia-smi reports a driver/library version mismatch ({query.detail or query.message})")
    if loaded and installed and loaded != installed:
        reboot_reasons.append(
            f"the loaded NVIDIA kernel module is {loaded} but the one installed for this kernel is {installed}"
        )
    if not loaded and installed:
        reboot_reasons.append(f"the NVIDIA kernel module {installed} is installed but not loaded")
    if reboot_reasons:
        return Assessment(tuple(reboot_reasons), ())

    if query.status == "driver_unreachable" and not installed:
        findings.append(
            "no NVIDIA kernel module is installed for the running kernel (modinfo nvidia found none) and nvidia-smi "
            "can't reach the driver: the driver package is missing or DKMS failed to build it (see `dkms status`)"
        )
    elif query.status != "ok":
        findings.append(query.message)
    else:
        findings.extend(_gpu_findings(query, required_branch, expected_gpu_name, require_persistence))
    return Assessment((), tuple(findings))


def _gpu_findings(query: GpuQuery, required_branch: int, expected_gpu_name: str, require_persistence: bool) -> list:
    findings = []
    for gpu in query.gpus:
        branch = driver_branch(gpu.driver_version)
        if branch is None or branch < required_branch:
            findings.append(
                f"GPU {gpu.index} runs driver {gpu.driver_version or 'unknown'}, but TwinSpark needs branch "
                f"{required_branch} or newer (nvidia_driver_branch): upgrade the driver (DGX OS: apt full-upgrade "
                "then reboot; plain Ubuntu: nvidia_driver_mode=install)"
            )
            break
    if expected_gpu_name and not any(gpu.name == expected_gpu_name for gpu in query.gpus):
        seen = ", ".join(repr(gpu.name) for gpu in query.gpus)
        findings.append(
            f"no {expected_gpu_name} visible (nvidia-smi lists {seen}): twinspark_profile=gb10 expects DGX Spark "
            "hardware"
        )
    if require_persistence:
        for gpu in query.gpus:
            if gpu.persistence_mode is False:
                findings.append(
                    f"persistence mode is off on GPU {gpu.index} ({gpu.name}): enable nvidia-persistenced "
                    "(the node_hygiene role does on gb10) so the driver stays initialised between vLLM starts"
                )
    return findings


def next_step(mode: str, assessment: Assessment, *, rebooted: bool, reboot_allowed: bool = True) -> Step:
    """Reboot (install mode, once, when allowed), fail with every finding, or carry on."""
    if assessment.reboot_required:
        reasons = "; ".join(assessment.reboot_reasons)
        if mode == "install" and not rebooted and reboot_allowed:
            return Step("reboot", f"rebooting to load the NVIDIA driver: {reasons}")
        if rebooted:
            return Step("fail", f"still not consistent after a reboot: {reasons}: check `dkms status` and the boot log")
        how = (
            "nvidia_driver_reboot is false: reboot the node yourself"
            if mode == "install"
            else "nvidia_driver_mode=verify changes nothing: reboot the node, or use nvidia_driver_mode=install"
        )
        return Step("fail", f"this node needs a reboot: {reasons}. {how}")
    if assessment.findings:
        return Step("fail", "; ".join(assessment.findings))
    return Step("ok", "")


def summary(query: GpuQuery) -> str:
    """One line for the role's report: 'NVIDIA GB10, driver 580.95.05 (branch 580), persistence on'."""
    parts = []
    for gpu in query.gpus:
        persistence = {True: "on", False: "off", None: "unknown"}[gpu.persistence_mode]
        parts.append(
            f"GPU {gpu.index} {gpu.name}, driver {gpu.driver_version} (branch {gpu.driver_branch}), "
            f"persistence {persistence}"
        )
    return "; ".join(parts)
