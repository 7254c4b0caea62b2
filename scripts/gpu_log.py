"""What every ``scripts/gpu_*.py`` run prints and keeps: lines stamped with the seconds since the run
began, and items that fail without hiding the others (each failure printed and kept with its traceback
for the run's JSON)."""

from __future__ import annotations

import time
import traceback

START = time.time()


def say(line: str) -> None:
    print(f"[{time.time() - START:6.1f}s] {line}", flush=True)


def attempt(errors: list, what: str, fn, *args):
    """``fn(*args)``, or None after printing the error and appending it to ``errors``."""
    try:
        return fn(*args)
    except Exception as exc:  # one broken item must not hide the others
        say(f"ERROR {what}: {type(exc).__name__}: {exc}")
        errors.append({"item": what, "error": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc()[-3000:]})
        return None
