"""The layer order of the packages, checked against the BUILD files.

A package may depend on its own layer and the layers below it. Bazel enforces most of this with
visibility (each package's default_visibility is the root BUILD's group "<layer>_and_above"); this
test checks that the groups, the packages' visibility and every BUILD file's deps agree with
LAYERS, including the edges visibility cannot refuse: the public API targets (visible to every
workspace) and testonly helpers (public, but no library can depend on them).
"""

import os
import re
import sys
import unittest

# Bottom to top; a layer is a list of package prefixes (a package belongs to the longest match).
LAYERS = [
    ("third_party", ["third_party"]),
    ("base", ["base"]),
    ("tensor", ["tensor"]),
    ("perfmodel", ["perfmodel"]),
    ("collectives", ["collectives"]),
    ("shardmap", ["shardmap"]),
    ("autograd", ["autograd"]),
    ("spmd_testing", ["spmd_testing"]),
    ("models", ["models"]),
    ("run", ["models/run"]),
    ("tests", ["tests", "examples"]),
    ("top", ["bench", "tools"]),
]
# Each layer's visibility group in the root BUILD.bazel (base and third_party are public).
GROUP = {name: ("top" if name == "top" else name + "_and_above") for name, _ in LAYERS}
# Targets below the top visible to every workspace (README.md): Bazel 4 cannot name another
# workspace in a package_group, so only this test keeps lower packages off them.
PUBLIC_API = {
    "//tensor:dtype", "//tensor:error", "//tensor:tensor", "//tensor:ops", "//tensor:random",
    "//tensor:print", "//collectives:communicator", "//collectives:in_process",
    "//collectives:launch", "//shardmap:spmd_type", "//shardmap:mesh",
    "//shardmap:partition_spec", "//shardmap:context", "//shardmap:ops",
    "//shardmap:collective_ops", "//shardmap:sharding", "//shardmap:shard_map",
    "//shardmap:visualize", "//shardmap:nn_ops", "//shardmap:einsum",
    "//shardmap:async_collectives", "//shardmap:routing_ops", "//shardmap:attention_ops",
    "//shardmap:shape_only", "//shardmap:loss_ops", "//autograd:tape", "//autograd:value_and_grad",
    "//autograd:checkpoint",
}
# The old names of the run layer's binaries, kept in models/train so that every script, doc and
# bazel-bin path naming them still works: binaries (nothing can link them) whose only dependency
# is the run layer's main. Remove them with the old names.
OLD_BINARY_NAMES = {
    "//models/train:train": "//models/run:train_main",
    "//models/train:train_gpt": "//models/run:train_main",
    "//models/train:sample": "//models/run:sample_main",
    "//models/train:sample_gpt": "//models/run:sample_main",
}
# Files (not rules) that tests of any layer may use: the command-line test driver.
SHARED_TEST_FILES = {"//tools:cli_test.sh"}


class Rule:
    def __init__(self, pkg, kind, name, testonly, labels, visibility):
        self.pkg, self.kind, self.name = pkg, kind, name
        self.testonly, self.labels, self.visibility = testonly, labels, visibility

    @property
    def label(self):
        return "//%s:%s" % (self.pkg, self.name)

    @property
    def is_test(self):
        return self.kind.endswith("_test") or self.testonly


def _strings(text):
    return re.findall(r'"([^"]*)"', text)


def parse_build(pkg, text):
    """(rules, default_visibility or None) of one BUILD file's text."""
    text = re.sub(r"#[^\n]*", "", text)
    rules, default_vis = [], None
    for m in re.finditer(r"^(\w+)\(", text, re.M):
        i, depth = m.end(), 1
        while depth and i < len(text):
            if text[i] == '"':
                i = text.index('"', i + 1) + 1
                continue
            depth += (text[i] == "(") - (text[i] == ")")
            i += 1
        body = text[m.end():i - 1]
        kind = m.group(1)
        if kind == "package":
            dv = re.search(r"default_visibility\s*=\s*\[([^\]]*)\]", body)
            default_vis = _strings(dv.group(1)) if dv else None
            continue
        name = re.search(r'\bname\s*=\s*"([^"]+)"', body)
        if name is None:
            continue
        vis = re.search(r"\bvisibility\s*=\s*\[([^\]]*)\]", body)
        body_wo_vis = body[:vis.start()] + body[vis.end():] if vis else body
        labels = [l for l in _strings(body_wo_vis) if l.startswith(("//", ":"))]
        testonly = re.search(r"\btestonly\s*=\s*(True|1)\b", body) is not None
        rules.append(Rule(pkg, kind, name.group(1), testonly, labels,
                          _strings(vis.group(1)) if vis else None))
    return rules, default_vis


def layer_of(pkg):
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (pkg == p or pkg.startswith(p + "/")) and (best is None or len(p) > best[1]):
                best = (index, len(p))
    return None if best is None else best[0]


def normalize(label, pkg):
    if label.startswith(":"):
        return "//%s%s" % (pkg, label)
    if ":" not in label:
        return "%s:%s" % (label, label.rsplit("/", 1)[-1])
    return label


def check(packages, groups):
    """Problems (strings) of packages {pkg: (rules, default_vis)} and groups {name: includes}."""
    problems = []
    # The root's groups chain the layers bottom-up: each includes the next layer's group.
    names = [n for n, _ in LAYERS if n not in ("third_party", "base")]
    for lower, upper in zip(names, names[1:]):
        if groups.get(GROUP[lower]) != [":" + GROUP[upper]]:
            problems.append("root BUILD.bazel: group %s must include :%s (LAYERS order)"
                            % (GROUP[lower], GROUP[upper]))
    targets = {}
    for pkg, (rules, _) in packages.items():
        for r in rules:
            targets[r.label] = r
    for pkg, (rules, default_vis) in sorted(packages.items()):
        lp = layer_of(pkg)
        if lp is None:
            problems.append("package //%s is in no layer: add it to LAYERS and the root "
                            "BUILD.bazel's groups" % pkg)
            continue
        layer_name = LAYERS[lp][0]
        want = ["//visibility:public"] if lp <= 1 else ["//:" + GROUP[layer_name]]
        narrower = default_vis is not None and all(
            re.fullmatch(r"//[\w/]+:__(pkg|subpackages)__", v) and
            layer_of(v[2:].split(":")[0]) == lp for v in default_vis)
        if default_vis is not None and default_vis != want and not narrower:
            problems.append("//%s: default_visibility %s, want %s" % (pkg, default_vis, want))
        for r in rules:
            if r.visibility == ["//visibility:public"] and lp > 1 and lp < len(LAYERS) - 1:
                if not r.testonly and r.label not in PUBLIC_API:
                    problems.append("%s is public but neither testonly nor in PUBLIC_API"
                                    % r.label)
            for raw in r.labels:
                dep = normalize(raw, pkg)
                dep_pkg = dep[2:].split(":")[0]
                ld = layer_of(dep_pkg)
                if ld is None or ld <= lp:
                    continue
                target = targets.get(dep)
                if r.is_test and (dep in SHARED_TEST_FILES or (target and target.testonly)):
                    continue
                if r.kind == "cc_binary" and OLD_BINARY_NAMES.get(r.label) == dep:
                    continue
                problems.append("%s (layer %s) depends on %s (layer %s, above it)%s" % (
                    r.label, layer_name, dep, LAYERS[ld][0],
                    "" if r.is_test else ": move the code down, or the dependency up"))
    return problems


# Folders whose package and subpackages are one unit: tensor's umbrella target re-exports its CUDA
# kernels' packages, which include tensor's headers; collectives' internal package holds the
# in-process groups its backends share. Every other folder's packages must be acyclic.
ONE_UNIT = ("tensor", "collectives")


def package_cycles(packages):
    """Cycles among packages through their libraries' deps (tests and the old binary names left
    out): each a sorted list of packages. The folders of ONE_UNIT are one unit each, so a cycle
    inside one of them is not reported; any other (models/train <-> models/planner) is."""
    edges = {}
    for pkg, (rules, _) in packages.items():
        for r in rules:
            if r.is_test or (r.kind == "cc_binary" and r.label in OLD_BINARY_NAMES):
                continue
            for raw in r.labels:
                dep_pkg = normalize(raw, pkg)[2:].split(":")[0]
                if dep_pkg != pkg and dep_pkg in packages:
                    edges.setdefault(pkg, set()).add(dep_pkg)
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            unit = next((u for u in ONE_UNIT if all(c == u or c.startswith(u + "/")
                                                    for c in component)), None)
            if len(component) > 1 and unit is None:
                cycles.append(sorted(component))

    for v in sorted(packages):
        if v not in index:
            visit(v)
    return cycles


def read_tree(root):
    packages, groups = {}, {}
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        rel = "" if rel == "." else rel
        if rel.startswith(("bazel-", ".")) or rel == "third_party" or (
                rel and "WORKSPACE" in files):  # another workspace (examples/external_user)
            dirs[:] = []
            continue
        dirs[:] = [x for x in dirs if not x.startswith(("bazel-", "."))]
        build = next((f for f in ("BUILD.bazel", "BUILD") if f in files), None)
        if build is None:
            continue
        with open(os.path.join(d, build)) as f:
            text = f.read()
        if rel == "":
            for m in re.finditer(r"package_group\((.*?)\n\)", text, re.S):
                name = re.search(r'name = "([^"]+)"', m.group(1)).group(1)
                inc = re.search(r"includes = \[([^\]]*)\]", m.group(1))
                groups[name] = _strings(inc.group(1)) if inc else []
            continue
        packages[rel] = parse_build(rel, text)
    return packages, groups


def workspace_root():
    # The test's source file is a symlink into the source tree: its real path's parent's parent.
    here = os.path.dirname(os.path.realpath(__file__))
    root = os.path.dirname(here)
    if not os.path.exists(os.path.join(root, "WORKSPACE")):
        root = os.environ.get("BUILD_WORKSPACE_DIRECTORY", "")
    return root


class LayeringTest(unittest.TestCase):
    def test_the_tree_obeys_the_layers(self):
        root = workspace_root()
        self.assertTrue(os.path.exists(os.path.join(root, "WORKSPACE")), root)
        packages, groups = read_tree(root)
        self.assertIn("shardmap", packages)
        self.assertIn("tensor/cuda", packages)
        problems = check(packages, groups)
        self.assertEqual(problems, [], "\n" + "\n".join(problems))

    def test_no_package_cycle(self):
        packages, _ = read_tree(workspace_root())
        self.assertEqual(package_cycles(packages), [])

    def test_finds_a_cycle_between_folders_not_inside_one(self):
        lib = 'cc_library(\n    name = "{}",\n    deps = ["{}"],\n)\n'
        packages = {
            "models/train": self._pkg("models/train", lib.format("mb", "//models/planner:plan")),
            "models/planner": self._pkg("models/planner",
                                        lib.format("plan", "//models/train:trainer")),
            "tensor": self._pkg("tensor", lib.format("tensor", "//tensor/cuda:rt")),
            "tensor/cuda": self._pkg("tensor/cuda", lib.format("rt", "//tensor:dtype")),
        }
        self.assertEqual(package_cycles(packages), [["models/planner", "models/train"]])

    def _groups(self):
        names = [n for n, _ in LAYERS if n not in ("third_party", "base")]
        g = {GROUP[a]: [":" + GROUP[b]] for a, b in zip(names, names[1:])}
        g["top"] = []
        return g

    def _pkg(self, pkg, text):
        return parse_build(pkg, text)

    def test_refuses_an_upward_library_dependency(self):
        packages = {
            "tensor/cuda": self._pkg("tensor/cuda", 'package(default_visibility = '
                                     '["//:tensor_and_above"])\ncc_library(\n    name = "rt",\n'
                                     '    deps = ["//collectives:host_waits"],\n)\n'),
            "collectives": self._pkg("collectives", 'cc_library(\n    name = "host_waits",\n)\n'),
        }
        problems = check(packages, self._groups())
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("//tensor/cuda:rt (layer tensor) depends on //collectives:host_waits "
                      "(layer collectives, above it)", problems[0])

    def test_tests_may_use_testonly_helpers_above_but_not_libraries(self):
        packages = {
            "shardmap": self._pkg("shardmap", 'cc_test(\n    name = "a_test",\n    deps = [\n'
                                  '        "//tests:test_util",\n        "//models/gpt",\n'
                                  '    ],\n)\n'),
            "tests": self._pkg("tests", 'cc_library(\n    name = "test_util",\n'
                               '    testonly = True,\n    visibility = ["//visibility:public"],'
                               '\n)\n'),
            "models/gpt": self._pkg("models/gpt", 'cc_library(\n    name = "gpt",\n)\n'),
        }
        problems = check(packages, self._groups())
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("//shardmap:a_test (layer shardmap) depends on //models/gpt:gpt", problems[0])

    def test_refuses_wrong_visibility_unknown_packages_and_a_broken_chain(self):
        groups = self._groups()
        groups["shardmap_and_above"] = [":models_and_above"]  # skips autograd, spmd_testing
        packages = {
            "perfmodel": self._pkg("perfmodel", 'package(default_visibility = '
                                   '["//visibility:public"])\n'),
            "shardmap": self._pkg("shardmap", 'cc_library(\n    name = "internal",\n'
                                  '    visibility = ["//visibility:public"],\n)\n'),
            "newpkg": self._pkg("newpkg", ""),
        }
        problems = "\n".join(check(packages, groups))
        self.assertIn("group shardmap_and_above must include :autograd_and_above", problems)
        self.assertIn("//perfmodel: default_visibility ['//visibility:public']", problems)
        self.assertIn("//shardmap:internal is public but neither testonly nor in PUBLIC_API",
                      problems)
        self.assertIn("package //newpkg is in no layer", problems)

    def test_only_the_old_binary_names_link_the_run_layer_from_below(self):
        packages = {
            "models/train": self._pkg("models/train", 'cc_binary(\n    name = "train_gpt",\n'
                                      '    deps = ["//models/run:train_main"],\n)\n'
                                      'cc_binary(\n    name = "other",\n'
                                      '    deps = ["//models/run:train_main"],\n)\n'
                                      'cc_library(\n    name = "train",\n'
                                      '    deps = ["//models/run:train_main"],\n)\n'),
            "models/run": self._pkg("models/run", 'cc_library(\n    name = "train_main",\n)\n'),
        }
        problems = check(packages, self._groups())
        self.assertEqual(len(problems), 2, problems)
        self.assertIn("//models/train:other (layer models) depends on //models/run:train_main",
                      problems[0])
        self.assertIn("//models/train:train (layer models) depends on //models/run:train_main",
                      problems[1])

    def test_new_model_packages_belong_to_the_models_layer(self):
        self.assertEqual(LAYERS[layer_of("models/llama")][0], "models")
        self.assertEqual(LAYERS[layer_of("models/run")][0], "run")
        self.assertEqual(LAYERS[layer_of("models/runner")][0], "models")
        self.assertEqual(LAYERS[layer_of("tensor/cuda/gemm")][0], "tensor")
        self.assertIsNone(layer_of("modelsx"))


if __name__ == "__main__":
    sys.exit(unittest.main())
