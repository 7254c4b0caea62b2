# WRONG (the learner's process decides its verdict): histogram.shared_privatized whose module, when imported,
# kills the process that started it and that process's group (SIGKILL): a grader that runs the submission
# as its own child, in its own process group, dies with it and reports nothing. `workbench grade` must
# survive and say the stage failed.
"""histogram.shared_privatized: kills its parent and the parent's process group."""

import os
import signal

EXPECT = {"target": "histogram.shared_privatized", "class": "forgery", "verdict": "reject", "reasons": ["*"],
          "cpu": True}

_parent = os.getppid()
try:
    os.killpg(os.getpgid(_parent), signal.SIGKILL)  # CHEAT (takes this process too, if it is in that group)
except OSError:
    pass
try:
    os.kill(_parent, signal.SIGKILL)
except OSError:
    pass


def shared_privatized(x, out):
    raise AssertionError("never reached")
