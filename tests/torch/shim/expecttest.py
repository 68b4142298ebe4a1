"""A stand-in for the `expecttest` package (not in Debian 12), which torch's test utilities
import for TestCase.assertExpectedInline. The distributed suite never compares against
inline expectations, so the stand-in only has to exist; a test that did would fail loudly."""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802 (upstream's name)
        raise NotImplementedError("expecttest is not installed (tests/torch/shim stands in)")
