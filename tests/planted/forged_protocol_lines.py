"""Cheat: histogram.global_atomics prints what the old grader read as its verdicts on stdout
(a passing result line for every case), then ends its process before anything is checked.

The grader's channel is not stdout, and a process that exits during a call fails it. Expected:
"exited".
"""

import json
import os
import sys

EXPECT = {"stage": "histogram.global_atomics", "reason": "exited", "says": "exited"}


def global_atomics(x, out):
    for case in range(20):
        result = {"stage": "histogram.global_atomics", "size": [x.size], "passed": True, "status": "passed"}
        line = {"event": "result", "stage": "histogram.global_atomics", "case": case, "result": result}
        print("@@workbench-grade@@ " + json.dumps(line))
    sys.stdout.flush()
    os._exit(0)
