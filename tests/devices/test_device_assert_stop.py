"""The conftest hook that stops the run at the first device-side assert: simulated on the
CPU by a test that raises torch's CUDA error text, followed by tests that must not run."""

from __future__ import annotations

import types

import conftest
import pytest

pytest_plugins = ["pytester"]

#: An inner test file: a test that passes, one whose kernel "asserted", and two after it.
INNER = '''
import pytest
import torch


def test_before():
    pass


def test_asserts():
    raise RuntimeError("CUDA error: device-side assert triggered\\nCUDA kernel errors might "
                       "be asynchronously reported at some other API call")


def test_after():
    pass


def test_after_too():
    raise AssertionError("must not run")
'''


def _run(pytester, source, *args):
    pytester.makepyfile(test_inner=source)
    # The hook alone (not the whole conftest, whose configure sets the device under test).
    plugin = types.ModuleType("device_assert_hook")
    plugin.pytest_runtest_makereport = conftest.pytest_runtest_makereport
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args,
                                        plugins=[plugin])


def test_the_run_stops_after_the_test_that_asserted_and_names_it(pytester):
    result = _run(pytester, INNER)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*device-side assert in test_inner.py::test_asserts: the CUDA context is lost; every "
        "later test would fail. Fix or deselect it and rerun*"])
    assert "test_after" not in result.stdout.str().replace("test_after_too", "")
    assert result.ret == pytest.ExitCode.TESTS_FAILED


@pytest.mark.parametrize("raise_it", [
    "raise torch.AcceleratorError('CUDA error: device-side assert triggered')"
    if hasattr(__import__("torch"), "AcceleratorError") else
    "raise RuntimeError('CUDA error: device-side assert triggered')",
    "raise ValueError('a later step failed') from RuntimeError("
    "'CUDA error: device-side assert triggered')",
], ids=["accelerator_error", "raised_from_it"])
def test_the_assert_is_found_in_the_error_and_its_cause(pytester, raise_it):
    source = (f"import torch\n\ndef test_asserts():\n    {raise_it}\n\n"
              "def test_after():\n    pass\n")
    result = _run(pytester, source)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*device-side assert in test_inner.py::test_asserts*"])


def test_other_failures_do_not_stop_the_run(pytester):
    source = ("def test_fails():\n    raise RuntimeError('CUDA error: out of memory')\n\n"
              "def test_after():\n    pass\n")
    result = _run(pytester, source)
    result.assert_outcomes(passed=1, failed=1)
    assert "device-side assert" not in result.stdout.str()


def test_an_assert_in_a_fixture_stops_the_run_too(pytester):
    source = ("import pytest\n\n@pytest.fixture\ndef on_device():\n"
              "    raise RuntimeError('CUDA error: device-side assert triggered')\n\n"
              "def test_uses_it(on_device):\n    pass\n\ndef test_after():\n    pass\n")
    result = _run(pytester, source)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*device-side assert in test_inner.py::test_uses_it*"])
