"""Django's own Tasks tests, vendored: the contract tests/tasks/test_django_contract.py runs against the backend.

From Django 6.1.3's source release (the sdist, `pip download --no-binary :all: --no-deps "Django==6.1.3"`), the
files of its tests/tasks/ that state what any backend owes the Tasks API:

    tests/tasks/tasks.py                    -> tasks.py                    (the tasks the tests enqueue)
    tests/tasks/test_tasks.py               -> tasks_api_tests.py          (Task and TaskResult, any backend)
    tests/tasks/test_immediate_backend.py   -> immediate_backend_tests.py  (what a backend that runs tasks does)

Renamed so that pytest does not collect them as they are (they would test Django's own Dummy and Immediate
backends); test_django_contract.py subclasses their test cases with TASKS naming DurableRunsBackend. The only edits
are the import lines, which read the API through .compat (django.tasks on Django 6, the django-tasks backport on
5.2, whose names differ in places), and the backends' paths and the logger's name spelt through .compat for the same
reason. Left out: test_dummy_backend.py and test_custom_backend.py, which test those backends' own behaviour (the
Dummy backend's in-memory results, a custom backend's hooks), not a contract of any backend.

Vendored rather than downloaded at test time: the suite stays runnable offline and in every lane without a step
in bin/setup, and the tests are pinned to a release whose text is here to read beside the exclusions. To update,
copy the three files from a newer release and redo the import edits.

Django is distributed under the BSD 3-clause license; its notice is kept in ./LICENSE and at the head of each file:
Copyright (c) Django Software Foundation and individual contributors. All rights reserved.
"""
