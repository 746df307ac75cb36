"""The fault-injecting soak (issue #21): a workload on a real Redis, a nemesis that breaks
things on a seeded schedule, a history of every operation and a checker of that history.

    .venv/bin/python -m bench.soak --duration 300 --faults all --seed 7

See docs/reliability.md for what it measured and bench/README.md for how to run it.
"""
