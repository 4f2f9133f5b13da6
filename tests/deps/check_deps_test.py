#!/usr/bin/env python3
"""scripts/check_deps.py can fail: the fixture tree (tests/deps/fixture: modules low and
high, high linking low PUBLIC, a test of high) passes as it is, and each planted fault --
a back edge, an undeclared edge, a cycle, a header owned twice or not at all -- fails with
the file, the line and the edge named. Run by ctest (deps_rule_fails_on_planted_edges)."""

import io
import json
import os
import shutil
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import check_deps  # noqa: E402


class CheckDepsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="daisy_deps_")
        self.root = os.path.join(self.tmp, "tree")
        shutil.copytree(os.path.join(HERE, "fixture"), self.root)

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def run_check(self, exclude=None):
        out = io.StringIO()
        status = check_deps.check(os.path.join(self.root, "graph.json"), exclude, out)
        return status, out.getvalue()

    def append(self, path, line):
        """Appends `line` to the fixture file; returns its line number."""
        with open(os.path.join(self.root, path), encoding="utf-8") as f:
            n = len(f.readlines())
        with open(os.path.join(self.root, path), "a", encoding="utf-8") as f:
            f.write(line + "\n")
        return n + 1

    def line_of(self, path, text):
        with open(os.path.join(self.root, path), encoding="utf-8") as f:
            return next(n for n, line in enumerate(f, 1) if text in line)

    def edit_graph(self, edit):
        path = os.path.join(self.root, "graph.json")
        with open(path, encoding="utf-8") as f:
            graph = json.load(f)
        edit(graph["targets"])
        with open(path, "w", encoding="utf-8") as f:
            json.dump(graph, f)

    def test_clean_fixture_passes(self):
        status, out = self.run_check()
        self.assertEqual(status, 0, out)
        self.assertIn("OK", out)
        self.assertIn("6 files", out)  # the two public headers, the three sources, detail.h (via low.cc)
        self.assertNotIn("not checked", out)

    def test_back_edge_fails_with_file_line_and_edge(self):
        line = self.append("src/low/low.cc", '#include "daisy/high.h"')
        status, out = self.run_check()
        self.assertEqual(status, 1, out)
        self.assertIn(f"src/low/low.cc:{line}: back edge low -> high: includes daisy/high.h", out)

    def test_back_edge_in_a_source_folder_header(self):
        line = self.append("src/low/detail.h", '#include "daisy/high.h"')
        status, out = self.run_check()
        self.assertEqual(status, 1, out)
        self.assertIn(f"src/low/detail.h:{line}: back edge low -> high", out)

    def test_private_link_is_not_passed_on(self):
        self.edit_graph(lambda t: t["daisy_high"].update(exports=[]))
        status, out = self.run_check()
        self.assertEqual(status, 1, out)
        line = self.line_of("src/high/high_test.cc", "daisy/low.h")
        self.assertIn(f"src/high/high_test.cc:{line}: undeclared edge high_test -> low", out)
        line = self.line_of("include/daisy/high.h", "daisy/low.h")
        self.assertIn(f"include/daisy/high.h:{line}: undeclared edge high -> low", out)
        self.assertNotIn("src/high/high.cc", out)  # high itself links low

    def test_cycle_names_every_edge(self):
        line = self.append("src/low/low.cc", '#include "daisy/high.h"')
        self.edit_graph(lambda t: t["daisy_low"].update(links=["daisy_high"]))
        status, out = self.run_check()
        self.assertEqual(status, 1, out)
        self.assertIn("link cycle: daisy_high -> daisy_low -> daisy_high", out)
        self.assertIn("include cycle high -> low -> high", out)
        self.assertIn(f"src/low/low.cc:{line} (daisy/high.h): low -> high", out)
        self.assertIn("(daisy/low.h): high -> low", out)
        self.assertNotIn("back edge", out)  # the links allow it: only the cycle is wrong

    def test_header_owned_twice(self):
        self.edit_graph(lambda t: t["daisy_high"].update(headers=["high.h", "low.h"]))
        status, out = self.run_check()
        self.assertEqual(status, 1, out)
        self.assertIn("include/daisy/low.h: owned by more than one module (high, low)", out)

    def test_header_owned_by_nobody(self):
        with open(os.path.join(self.root, "include/daisy/stray.h"), "w", encoding="utf-8") as f:
            f.write("#pragma once\n")
        status, out = self.run_check()
        self.assertEqual(status, 1, out)
        self.assertIn("include/daisy/stray.h: no module owns it", out)

    def test_declared_header_missing(self):
        self.edit_graph(lambda t: t["daisy_low"].update(headers=["low.h", "gone.h"]))
        status, out = self.run_check()
        self.assertEqual(status, 1, out)
        self.assertIn("module low declares HEADERS gone.h, but include/daisy/gone.h does not exist", out)

    def test_exclusion_list_skips_a_folder(self):
        self.append("src/low/low.cc", '#include "daisy/high.h"')
        exclude = os.path.join(self.tmp, "exclude.txt")
        with open(exclude, "w", encoding="utf-8") as f:
            f.write("# comment\nsrc/low/\n")
        status, out = self.run_check(exclude)
        self.assertEqual(status, 0, out)
        self.assertIn("files not checked", out)


if __name__ == "__main__":
    unittest.main()
