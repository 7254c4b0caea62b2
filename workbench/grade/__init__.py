"""The autograder room: ``workbench grade [OP[.STAGE]] [--impl exercises|solutions|FILE|DIR]``.

A submission (a generated exercise, the answer key, or any file that defines a stage's launcher) is
judged by the operator in ``solutions/``, never by anything the submission defines: its reference,
its inputs, its tolerance and its sizes. The submission's code runs only in a worker process; the
grader makes the inputs there (with a seed the worker never sees), sends them, gets the outputs back
over a channel of its own, and computes the reference and the verdict itself.

For every stage: is it there and the submission's own code; each case (random inputs at sizes that
are not multiples of any block, the first size again on new inputs, the operator's adversarial
inputs at the small sizes; the output poisoned, every element compared, the inputs compared after
the call) while the worker watches what the call does (a kernel must be launched; no device data
read on the host, no output written from it; no process started, no file of the repository
written, no answer key imported or read); on a GPU, a speed bar (``Operator.grade_speed_bar`` of the
solution stage's bandwidth, both timed in the same run).

Modules, each one thing:

* ``report``: the report model and its text, JSON and JUnit forms; ``reasons``: failure codes and advice;
* ``targets``: which stages, which file, which sizes (reads the answer key, never runs a submission);
* ``cases``: one case in the grader's process (inputs, verdict); ``stages``: one stage, start to verdict;
* ``supervisor``: the worker process, from the grader's side; ``channel``: the socket they talk over;
* ``worker``: the worker's side; ``submission``: loading a submission and describing its code;
  ``guards``: what the worker refuses; ``watch``: one watched call;
* ``api``: ``grade()`` and ``grade_function()`` (a notebook's launcher, in-process); ``cli``: ``add_cli``.
"""

from .api import grade, grade_function
from .report import Report

__all__ = ["Report", "grade", "grade_function"]
