"""Checking envs and what surrounds them, apart from the env API itself.

- :mod:`envhub.checks.checker` — :func:`~envhub.checks.checker.check_env`: an env against the
  API's contract (spaces, seeds, rewards, roles, reference policy);
- :mod:`envhub.checks.package` — an env package's gates before a push (its checks, tests and
  performance card);
- :mod:`envhub.checks.table` — the table both print;
- :mod:`envhub.checks.doctor` — ``envhub doctor``: what this machine can run;
- :mod:`envhub.checks.pytest_bundle` — pytest for tests run inside sandbox sessions.

``envhub.check_env`` is the same function as ever (re-exported by the package).
"""
