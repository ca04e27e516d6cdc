"""The benchmark suite of durableruns: `python -m bench.run` (see bench/run.py) measures what durability costs
against the PostgreSQL floor (bench.floor) and DBOS Transact (bench.dbos_baseline), and writes bench/results/."""
