"""shardmap_deps(): the repositories a workspace needs to build shardmap, offline.

In a workspace that depends on shardmap (see examples/external_user/ for a tested one):

    # WORKSPACE
    local_repository(name = "shardmap", path = "/path/to/shardmap")
    load("@shardmap//:deps.bzl", "shardmap_deps")
    shardmap_deps()

    # .bazelrc (shardmap's headers are C++20; they stop with a clear #error otherwise)
    build --cxxopt=-std=c++20 --host_cxxopt=-std=c++20

It declares, unless the workspace already has a repository of that name:
  rules_cc, remote_coverage_tools  offline stand-ins kept in shardmap's third_party/ (Bazel 4
                                   would otherwise download them);
  rules_java, platforms            Debian's copies (bazel-rules-java, bazel-platforms);
  local_cuda                       the CUDA toolkit at $CUDA_PATH or /usr/local/cuda, or empty
                                   targets without one (third_party/cuda/cuda_configure.bzl).
The system libraries (Abseil, GoogleTest, Benchmark, OpenBLAS) are Debian packages: run
shardmap's tools/setup.sh once.
"""

load("//third_party/cuda:cuda_configure.bzl", "cuda_configure")

def _shardmap_subdir_impl(rctx):
    # The folder of `marker` inside shardmap, whatever path the user gave to shardmap itself.
    src = rctx.path(rctx.attr.marker).dirname
    for child in src.readdir():
        rctx.symlink(child, child.basename)

# A repository made of one folder of shardmap's source tree (by a file label inside it).
_shardmap_subdir = repository_rule(
    implementation = _shardmap_subdir_impl,
    attrs = {"marker": attr.label(allow_single_file = True, mandatory = True)},
    local = True,
)

def _maybe(rule, name, **kwargs):
    if not native.existing_rule(name):
        rule(name = name, **kwargs)

def shardmap_deps():
    """Declares the repositories shardmap needs (see the file comment). Call from WORKSPACE."""
    _maybe(
        _shardmap_subdir,
        name = "rules_cc",
        marker = Label("//third_party/rules_cc:WORKSPACE"),
    )
    _maybe(
        _shardmap_subdir,
        name = "remote_coverage_tools",
        marker = Label("//third_party/remote_coverage_tools:WORKSPACE"),
    )
    _maybe(native.local_repository, name = "rules_java", path = "/usr/share/bazel/rules/java")
    _maybe(native.local_repository, name = "platforms", path = "/usr/share/bazel/tools/platforms")
    _maybe(cuda_configure, name = "local_cuda")
