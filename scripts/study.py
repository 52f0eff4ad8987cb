"""What the study scripts share: one `rlvr` run per arm and seed, run once, continued when cut off.

    from study import RLVR, run_once   # (a script in scripts/ finds this module beside it)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RLVR = str(Path(sys.executable).with_name("rlvr"))


def run_once(command: list[str], run_dir: Path, report_only: bool = False) -> bool:
    """Run `command` (which writes into `run_dir`) unless its run finished there (a summary.json);
    continue it with trainer.resume=auto when it was cut off. With `report_only` nothing is run.
    Returns whether `run_dir` holds a finished run."""
    if (run_dir / "summary.json").is_file():
        return True
    if report_only:
        return False
    if (run_dir / "metrics.jsonl").exists():
        command = [*command, "trainer.resume=auto"]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)
    return True
