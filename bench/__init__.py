"""Baseline benchmarks: the PostgreSQL commit floor and DBOS Transact, for comparison with durable runs."""
