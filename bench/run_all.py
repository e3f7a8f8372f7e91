"""Run every benchmark under bench/ with its default (CPU-sized) arguments; each prints one JSON line."""

import subprocess
import sys
from pathlib import Path

for script in sorted(Path(__file__).parent.glob("bench_*.py")):
    subprocess.run([sys.executable, str(script)], check=False)
