"""Run the `tune` command line from a source checkout: `python cli.py run --shapes ...`.

Installed, the same command is the `tune` console script (tuner.cli:main). From a checkout the
folders kernels/, db/ and search_spaces/ are mapped into the `tuner` namespace here, as
setuptools' package-dir does on install.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

import tuner  # noqa: E402

tuner.__path__.append(str(ROOT))

from tuner.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
