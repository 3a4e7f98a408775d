"""shardmap_cc_test: a cc_test with shardmap's testing library, for users' per-device code.

    load("@shardmap//spmd_testing:defs.bzl", "shardmap_cc_test")

    shardmap_cc_test(
        name = "my_layer_test",
        srcs = ["my_layer_test.cc"],
        deps = [":my_layer"],
        gpu = True,          # also my_layer_test_gpu, tagged "gpu"
    )

It adds //spmd_testing, the shardmap libraries a test of per-device code uses (shard_map,
ops, collectives, value_and_grad, tensor:random) and GoogleTest's main; sets
OPENBLAS_NUM_THREADS=1 (the ranks are the parallelism); size "small" unless given, and the
timeout that size implies (60 s) unless `timeout` is given: a test of per-device code on a few
simulated devices runs in seconds, and a longer timeout only earns Bazel's "specified size is
too big" warning. Give size = "medium" (or timeout = "moderate") to a test that needs minutes.

With gpu = True a second target <name>_gpu runs the same test with SHARDMAP_TEST_PLACEMENT=gpu:
the helpers of spmd_testing run their ranks on the GPU (virtual ranks sharing GPU 0), and
without a GPU each test case reports SKIPPED with the reason ("no GPU: ...").
Filter GPU targets out with --test_tag_filters=-gpu.
"""

_DEPS = [
    Label("//spmd_testing"),
    Label("//autograd:value_and_grad"),
    Label("//shardmap:collective_ops"),
    Label("//shardmap:mesh"),
    Label("//shardmap:ops"),
    Label("//shardmap:partition_spec"),
    Label("//shardmap:shard_map"),
    Label("//tensor"),
    Label("//tensor:random"),
    Label("//third_party:gtest_main"),
]

def _norm(label):
    # "@shardmap//a/b", "//a/b:b", Label("//a/b") -> "//a/b:b", to spot a dependency given twice.
    s = str(label)
    if s.startswith("@"):
        s = s[s.index("//"):]
    if ":" not in s:
        s = s + ":" + s.split("/")[-1]
    return s

def shardmap_cc_test(
        name,
        srcs,
        deps = [],
        size = "small",
        timeout = None,
        gpu = False,
        env = {},
        tags = [],
        **kwargs):
    """A cc_test of per-device code; see the file comment."""
    given = [_norm(d) for d in deps]
    deps = deps + [d for d in _DEPS if _norm(d) not in given]
    base_env = {"OPENBLAS_NUM_THREADS": "1"}
    base_env.update(env)
    if timeout != None:
        kwargs["timeout"] = timeout
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps,
        size = size,
        env = base_env,
        tags = tags,
        **kwargs
    )
    if gpu:
        gpu_env = dict(base_env)
        gpu_env["SHARDMAP_TEST_PLACEMENT"] = "gpu"
        native.cc_test(
            name = name + "_gpu",
            srcs = srcs,
            deps = deps,
            size = size,
            env = gpu_env,
            tags = tags + ["gpu"],
            **kwargs
        )
