"""Record every figure in README and the notebooks in one run on a GPU: the device's peaks, then every
ladder in the registry (operators with ``record_all_sizes=True`` at all their bench sizes, the rest at
their headline size). Run from the repository root: `python scripts/record_all.py` (about 7 minutes on an
H200 for the float32 ladders), then `workbench table --update-readme`, `workbench plot OP --out
results/plots` for each operator, and `workbench notebooks build --execute --recorded`.

`--dry-run` prints the plan without measuring anything (it works without a GPU); `--only OP ...` limits
the run to some operators.
"""
import argparse
import time

import workbench  # noqa: F401  (chooses GPU or simulator before numba is imported)
from workbench.cli import main
from workbench.registry import load_operators


def plan(only=None) -> list[list[str]]:
    """The workbench commands this script runs, in order."""
    ops = [op for op in load_operators().values() if not only or op.name in only]
    return [["peaks"]] + [["bench", op.name] + ([] if op.record_all_sizes else ["--quick"]) for op in ops]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the commands, measure nothing")
    parser.add_argument("--only", nargs="+", metavar="OP", help="only these operators")
    args = parser.parse_args()
    commands = plan(args.only)
    if args.dry_run:
        print("\n".join("workbench " + " ".join(c) for c in commands))
        raise SystemExit(0)
    t0 = time.time()
    status = 0
    for command in commands:
        print(f"=== workbench {' '.join(command)} ({time.time() - t0:.0f} s)", flush=True)
        status |= main(command)
    print(f"done in {time.time() - t0:.0f} s, status {status}")
    raise SystemExit(status)
