"""Refuse to test stale compiled code: Python imports a module's mypyc-compiled extension ahead of its ``.py``,
so after an edit without a rebuild the tests would run the old code and pass or fail for the wrong reason."""

from __future__ import annotations

import pytest

from proxy.build_info import stale_modules

# The checks the deployment tests share live outside the test modules; pytest explains a failed assert only in
# modules it rewrites.
pytest.register_assert_rewrite("tests.harness.kube_objects")


def pytest_sessionstart(session: pytest.Session) -> None:
    stale = stale_modules()
    if stale:
        pytest.exit(
            f"compiled modules are older than their source: {', '.join(stale)}; rebuild with scripts/setup "
            "--test (or delete their .so files to test the pure-Python source)",
            returncode=3,
        )
