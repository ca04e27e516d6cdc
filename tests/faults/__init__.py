"""durableruns under faults: real worker processes killed, databases restarted, bad input, and the demo.

    test_crash_matrix.py      SIGKILL at every point of the step cycle, for every policy
    test_soak.py              200 runs, two workers killed again and again
    test_postgres_restart.py  a private PostgreSQL restarted mid-pass (fast, and immediate)
    test_bad_input.py         bad input through the purchase order, deploys and the command line
    test_demo.py              `manage.py demo` as CI runs it
    test_naive_resume.py      the lagging search of the design source, against a lookup by key

A worker paused past its lease (SIGSTOP, another worker claims the run, SIGCONT) is covered by
tests/integration/test_workers.py::test_a_worker_paused_past_its_lease_has_its_writes_refused.
Worker subprocesses load probe.py (every point logged before an armed kill) and, for the bad-input tests, the
other deploys in deploys.py, deploy_v2.py and deploy_buggy.py; none of these is imported by the test process.
"""
