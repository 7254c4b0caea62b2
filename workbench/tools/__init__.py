"""The tools room: ``workbench profile`` (Nsight Compute counters per stage) and ``workbench sanitize``
(compute-sanitizer's memcheck, racecheck, synccheck and initcheck, one teaching line per finding).

Both run a stage in a child process under the NVIDIA tool (``python -m workbench.tools.target``), so
the tool sees one stage's kernels and nothing of the workbench's own; the parsing and the recorded
files live in the model (``workbench.profiles``, ``workbench.sanitizer_reports``). Each module has
``add_cli(subparsers)``; the room never imports the other rooms.
"""
