"""Tests import the SDK from this checkout (no install needed)."""

import pathlib
import sys

here = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(here.parents[1] / "guest-sdk" / "python" / "src"))
sys.path.insert(0, str(here))
