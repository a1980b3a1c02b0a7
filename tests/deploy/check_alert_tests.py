#!/usr/bin/env python3
"""Checks that tessera-rules_test.yml covers every alert of tessera-rules.yml
with at least one case where it fires (non-empty exp_alerts) and one where it
does not (exp_alerts: []). promtool itself only runs the cases written.

usage: check_alert_tests.py RULES_YML TEST_YML
"""
import re
import sys


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        alerts = re.findall(r"^\s*-\s*alert:\s*(\S+)\s*$", f.read(), re.M)
    if not alerts:
        print(f"FAIL: no alerts found in {argv[1]}")
        return 1
    firing, quiet = set(), set()
    current = None
    with open(argv[2]) as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\s*alertname:\s*(\S+)\s*$", line)
        if m:
            current = m.group(1)
            continue
        m = re.match(r"^\s*exp_alerts:\s*(\[\])?\s*(#.*)?$", line)
        if m and current:
            if m.group(1):
                quiet.add(current)
            elif i + 1 < len(lines) and re.match(r"^\s*-\s*exp_labels:", lines[i + 1]):
                firing.add(current)
            current = None
    fail = False
    for a in alerts:
        missing = [w for w, s in (("firing", firing), ("not-firing", quiet)) if a not in s]
        if missing:
            print(f"FAIL: {a}: no {' and no '.join(missing)} test case")
            fail = True
        else:
            print(f"ok: {a}: firing and not-firing cases")
    for a in sorted((firing | quiet) - set(alerts)):
        print(f"FAIL: test cases for unknown alert {a}")
        fail = True
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
