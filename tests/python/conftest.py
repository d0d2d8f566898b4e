"""conftest.py - what every Python test shares: where the shared test data is,
and what a skip for missing shared data means.

The shared test data (SavedModels, ONNX node tests) is not part of the
repository: it is ../shared/testdata next to the repository, or KILN_TESTDATA.
A test that needs it skips, naming the path it looked for, so that a user
without it gets a clear skip (ctest runs pytest with -rs, which lists every
skip and its reason, and a run in which something was skipped but nothing
failed exits with 77, ctest's SKIP_RETURN_CODE, so ctest reports the python
test as skipped instead of passed). With KILN_REQUIRE_TESTDATA=1 (CI sets it) such a skip
becomes a failure: any skip whose reason names the shared test data folder
fails the test, so data that CI must have cannot go missing unnoticed.
"""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TESTDATA = Path(os.environ.get("KILN_TESTDATA") or REPO.parent / "shared" / "testdata")
REQUIRE_TESTDATA = os.environ.get("KILN_REQUIRE_TESTDATA") == "1"
SKIP_CODE = 77
_skipped = []


def _skip_reason(report):
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        return str(report.longrepr[2])
    return str(report.longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_TESTDATA and report.skipped:
        reason = _skip_reason(report)
        names = {str(TESTDATA), str(TESTDATA.resolve()) if TESTDATA.exists() else str(TESTDATA)}
        if any(n in reason for n in names) or "shared test data" in reason:
            report.outcome = "failed"
            report.longrepr = (f"KILN_REQUIRE_TESTDATA=1, but this test needs shared test data "
                               f"that is missing: {reason}")


def pytest_runtest_logreport(report):
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and _skipped:
        session.exitstatus = SKIP_CODE
