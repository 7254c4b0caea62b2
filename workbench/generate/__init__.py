"""Rooms that generate files from ``solutions/``: ``exercises`` (the learner's copies) and ``notebooks``.

Each is a program of its own with ``add_cli(subparsers)``; they use the model below them (registry,
paths, markers, ...) and never each other, the grader or the CLI.
"""
