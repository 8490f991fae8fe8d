"""Accuracy checks beside the speed: tasks with checkable answers, scoring, and a greedy runner.

``tasks`` (what to ask), ``scoring`` (was it right, and is a drop beyond noise), ``runner`` (ask a
server). See docs/eval.md.
"""
