"""Unit tests of tests/faults/checker.py on small hand-written histories,
some linearizable and some not (run: python3 -m unittest tests/faults/test_checker.py).

Times are in seconds; ``W``/``R``/... build one op: (client, invoke, complete).
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checker import (DEFAULT, FAIL, INF, OK, UNKNOWN, Budget, Op, check,  # noqa: E402
                     double_executions, first_violation, linearizable)


def W(c, t0, t1, v, status=OK):
    return Op("k", c, "write", v, None, status, t0, t1 if status == OK else INF)


def R(c, t0, t1, out, status=OK):
    return Op("k", c, "read", None, out, status, t0, t1)


def D(c, t0, t1, destroyed=None, status=OK):
    return Op("k", c, "destroy", None, destroyed, status, t0, t1 if status == OK else INF)


def C(c, t0, t1, created=None, status=OK):
    return Op("k", c, "create", None, created, status, t0, t1 if status == OK else INF)


def T(c, t0, t1, status=OK):
    return Op("k", c, "touch", None, None, status, t0, t1 if status == OK else INF)


class Registers(unittest.TestCase):
    def test_sequential_is_linearizable(self):
        self.assertTrue(linearizable([W(0, 0, 1, 1), R(0, 2, 3, 1), W(0, 4, 5, 2),
                                      R(0, 6, 7, 2)]))

    def test_read_of_absent_key_is_none(self):
        self.assertTrue(linearizable([R(0, 0, 1, None)]))
        self.assertFalse(linearizable([R(0, 0, 1, 5)]))

    def test_concurrent_read_may_see_old_or_new(self):
        for seen in (None, 1):
            self.assertTrue(linearizable([W(0, 0, 10, 1), R(1, 1, 2, seen)]), seen)

    def test_stale_read_after_ack_is_not_linearizable(self):
        h = [W(0, 0, 1, 1), W(0, 2, 3, 2), R(1, 4, 5, 1)]
        self.assertFalse(linearizable(h))
        self.assertIs(first_violation(h), h[2])

    def test_lost_write(self):
        h = [W(0, 0, 1, 1), R(1, 2, 3, 1), R(1, 4, 5, None)]
        res = check(h)
        self.assertEqual([v["kind"] for v in res["violations"]], ["lost_write"])

    def test_stale_read_classified(self):
        h = [W(0, 0, 1, 1), W(0, 2, 3, 2), R(1, 4, 5, 1), R(1, 6, 7, 2)]
        self.assertEqual([v["kind"] for v in check(h)["violations"]], ["stale_read"])

    def test_reads_must_agree_on_an_order(self):
        # two writes overlap; readers must not see them in opposite orders
        h = [W(0, 0, 10, 1), W(1, 0, 10, 2),
             R(2, 1, 2, 1), R(2, 3, 4, 2),
             R(3, 1, 2, 2), R(3, 3, 4, 1)]
        self.assertFalse(linearizable(h))
        self.assertTrue(linearizable(h[:4] + [R(3, 1, 2, 1), R(3, 3, 4, 2)]))

    def test_a_read_cannot_see_a_value_never_written(self):
        self.assertFalse(linearizable([W(0, 0, 1, 1), R(1, 2, 3, 7)]))

    def test_failed_write_takes_no_effect(self):
        h = [W(0, 0, 1, 1), W(0, 2, 3, 2, status=FAIL), R(1, 4, 5, 2)]
        self.assertFalse(linearizable(h))
        self.assertTrue(linearizable(h[:2] + [R(1, 4, 5, 1)]))


    def test_a_failed_write_must_not_become_visible(self):
        h = [W(0, 0, 1, 1), W(0, 2, 3, 2, status=FAIL), R(1, 4, 5, 2)]
        self.assertEqual([v["kind"] for v in check(h)["violations"]], ["failed_write_visible"])

    def test_a_failed_write_is_left_out_of_prefixes_too(self):
        # the failed write's error arrives late (t=10); the read of its value
        # at t=4 is the first violation, not the read of the old value after it
        h = [W(0, 0, 1, 1), Op("k", 0, "write", 2, None, FAIL, 2, 10), R(1, 3, 4, 2),
             R(1, 5, 6, 1)]
        self.assertIs(first_violation(h), h[2])
        self.assertEqual([v["kind"] for v in check(h)["violations"]], ["failed_write_visible"])


class Unknown(unittest.TestCase):
    def test_unknown_write_may_take_effect_late_or_never(self):
        base = [W(0, 0, 1, 1), W(0, 2, 0, 2, status=UNKNOWN)]
        for reads in ([1, 1], [2, 2], [1, 2]):
            h = base + [R(1, 3 + 2 * j, 4 + 2 * j, v) for j, v in enumerate(reads)]
            self.assertTrue(linearizable(h), reads)

    def test_unknown_write_takes_effect_once(self):
        # seen, then not seen again, with no other write: impossible
        h = [W(0, 0, 1, 1), W(0, 2, 0, 2, status=UNKNOWN), R(1, 3, 4, 2), R(1, 5, 6, 1)]
        self.assertFalse(linearizable(h))

    def test_unknown_write_not_before_its_invoke(self):
        h = [W(0, 0, 1, 1), R(1, 2, 3, 2), W(0, 4, 0, 2, status=UNKNOWN)]
        self.assertFalse(linearizable(h))

    def test_unknown_read_is_ignored(self):
        self.assertTrue(linearizable([W(0, 0, 1, 1), R(1, 2, 0, 9, status=UNKNOWN)]))


class Lifecycle(unittest.TestCase):
    def test_resurrection_after_destroy(self):
        h = [W(0, 0, 1, 1), D(0, 2, 3, True), R(1, 4, 5, 1)]
        res = check(h)
        self.assertEqual([v["kind"] for v in res["violations"]], ["resurrection"])

    def test_resurrection_while_an_exec_recreates(self):
        # the shape the smoke run found: destroy acked, an exec re-creates the
        # sandbox, and a read sees the value written before the destroy
        h = [W(0, 0, 1, 11), D(0, 2, 3, True), R(0, 4, 5, None), T(0, 6, 20), R(1, 10, 11, 11)]
        res = check(h)
        self.assertEqual([v["kind"] for v in res["violations"]], ["resurrection"])
        h[4] = R(1, 10, 11, DEFAULT)
        self.assertEqual(check(h)["violations"], [])

    def test_destroy_then_create_gives_default(self):
        h = [W(0, 0, 1, 1), D(0, 2, 3, True), C(0, 4, 5, True), R(1, 6, 7, DEFAULT)]
        self.assertTrue(linearizable(h))
        h[3] = R(1, 6, 7, 1)
        self.assertFalse(linearizable(h))

    def test_exec_recreates_a_destroyed_sandbox(self):
        h = [W(0, 0, 1, 1), D(0, 2, 3, True), T(0, 4, 5), R(1, 6, 7, DEFAULT)]
        self.assertTrue(linearizable(h))
        # an exec on a live sandbox leaves its value alone
        self.assertFalse(linearizable([W(0, 0, 1, 1), T(0, 2, 3), R(1, 4, 5, DEFAULT)]))

    def test_destroyed_flag_must_match(self):
        # a destroy that says it destroyed nothing although a write was acked
        self.assertFalse(linearizable([W(0, 0, 1, 1), D(0, 2, 3, False)]))
        self.assertTrue(linearizable([W(0, 0, 1, 1), D(0, 2, 3, True), D(0, 4, 5, False)]))

    def test_created_flag_must_match(self):
        self.assertFalse(linearizable([W(0, 0, 1, 1), C(0, 2, 3, True)]))
        self.assertTrue(linearizable([C(0, 0, 1, True), C(1, 2, 3, False)]))

    def test_unknown_destroy_may_explain_an_absent_read(self):
        h = [W(0, 0, 1, 1), D(0, 2, 0, status=UNKNOWN), R(1, 3, 4, None)]
        self.assertTrue(linearizable(h))
        self.assertEqual(check(h)["violations"], [])


class Search(unittest.TestCase):
    def test_many_concurrent_ops_stay_fast(self):
        # 12 overlapping writes and a read of each order: memoization keeps
        # this small (without it the search is 12! orders)
        h = [W(c, 0, 100, c) for c in range(12)] + [R(99, 101, 102, 5)]
        self.assertTrue(linearizable(h))
        self.assertFalse(linearizable(h + [R(99, 103, 104, 6)]))

    def test_budget(self):
        h = [W(c, 0, 100, c) for c in range(12)] + [R(99, 101, 102, 50)]
        with self.assertRaises(Budget):
            linearizable(h, budget=50)

    def test_keys_are_checked_separately(self):
        a = [W(0, 0, 1, 1), R(0, 2, 3, 1)]
        b = [Op("other", 1, "write", 2, None, OK, 0, 1), Op("other", 1, "read", None, 3, OK, 2, 3)]
        res = check(a + b)
        self.assertEqual(res["keys"], 2)
        self.assertEqual([v["key"] for v in res["violations"]], ["other"])


class DoubleExec(unittest.TestCase):
    def test_one_execution_per_request_id(self):
        self.assertEqual(double_executions({"r1": [(10, 5)], "r2": [(11, 6), (11, 6)]}), [])
        self.assertEqual(double_executions({"r1": [(10, 5), (12, 9)]}),
                         [("r1", [(10, 5), (12, 9)])])


if __name__ == "__main__":
    unittest.main()
