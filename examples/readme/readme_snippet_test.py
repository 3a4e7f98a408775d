#!/usr/bin/python3
"""The README shows the code of examples/readme/mlp.cc: each region between
`// [README: <name>]` and `// [README: end]` must appear, dedented, as consecutive lines of a
```cpp block of README.md, and every #include of those blocks must be one mlp.cc has. So the
README's first example is the program CI runs (//examples/readme:mlp_test)."""
import re
import textwrap
import unittest

README = "README.md"
SOURCE = "examples/readme/mlp.cc"


def regions(source):
    out = {}
    for m in re.finditer(r"^ *// \[README: (?!end\])([^\]]+)\]\n(.*?)^ *// \[README: end\]\n",
                         source, re.S | re.M):
        out[m.group(1)] = textwrap.dedent(m.group(2))
    return out


def cpp_blocks(readme):
    return [m.group(1) for m in re.finditer(r"^```cpp\n(.*?)^```", readme, re.S | re.M)]


class ReadmeSnippetTest(unittest.TestCase):

    def test_readme_shows_the_example(self):
        with open(SOURCE) as f:
            source = f.read()
        with open(README) as f:
            blocks = cpp_blocks(f.read())
        found = regions(source)
        self.assertEqual(sorted(found), ["dp-sharded batch", "per-device code"])
        for name, code in found.items():
            self.assertTrue(any(code in b for b in blocks),
                            f"README.md has no ```cpp block containing the '{name}' region of "
                            f"{SOURCE}:\n{code}")
        includes = set(re.findall(r"^#include .*$", source, re.M))
        for b in blocks:
            if any(code in b for code in found.values()):
                for inc in re.findall(r"^#include .*$", b, re.M):
                    self.assertIn(inc, includes, f"README includes {inc}, {SOURCE} does not")


if __name__ == "__main__":
    unittest.main()
