# WRONG (the learner's process decides its verdict): scan.reduce_then_scan whose module, when imported,
# ignores SIGTERM, SIGINT and SIGHUP and then never returns. A grader that asks its worker to stop, or
# waits for it, waits forever; `workbench grade` must give up after its timeout, kill it, and say so.
"""scan.reduce_then_scan: hangs at import, deaf to polite signals."""

import signal
import time

EXPECT = {"target": "scan.reduce_then_scan", "class": "forgery", "verdict": "reject", "reasons": ["*"],
          "cpu": True}

for _signal in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_signal, signal.SIG_IGN)
while True:
    time.sleep(1)  # CHEAT: never finishes importing


def reduce_then_scan(x, y):
    raise AssertionError("never reached")
