"""cuda_library: compiles .cu files with nvcc (sm_90 for H100/H200) into a cc_library.

Without a toolkit it is a plain cc_library of the headers, so callers must guard kernel calls
with `#if SHARDMAP_HAS_CUDA`.
"""

load("@local_cuda//:defs.bzl", "CUDA_AVAILABLE", "CUDA_PATH")

def _workspace_root():
    """The execroot-relative root of the repository being loaded: "" or "external/<name>"."""
    repo = native.repository_name()  # "@" for the main workspace, "@shardmap" otherwise
    return "" if repo == "@" else "external/" + repo[1:]

def cuda_library(name, srcs = [], hdrs = [], deps = [], copts = [], cu_hdrs = [], **kwargs):
    """srcs: .cu files; hdrs: headers they (and users) include, listed once.

    cu_hdrs: further header files (labels) the .cu files include, e.g. a shared kernel_util.cuh
    or //tensor:dtype.h; nvcc sees only srcs, hdrs and these.
    """
    if not CUDA_AVAILABLE:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, **kwargs)
        return
    # nvcc resolves "tensor/dtype.h" against this repository's root: "." in shardmap's own
    # workspace, external/<name> when shardmap is a dependency (and likewise under $(GENDIR)).
    root = _workspace_root()
    includes = "-I{root} -I$(GENDIR){sub} ".format(
        root = root or ".",
        sub = "/" + root if root else "",
    )
    objs = []
    for src in srcs:
        obj = name + "_" + src.replace("/", "_").replace(".cu", ".o")
        native.genrule(
            name = obj + "_nvcc",
            srcs = [src] + hdrs + cu_hdrs,
            outs = [obj],
            # nvcc by its real path: through a sandbox symlink it cannot find cicc or its headers.
            cmd = (CUDA_PATH + "/bin/nvcc -std=c++20 -O3 " +
                   "-gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90 " +
                   "-Xcompiler=-fPIC " + includes + "-DSHARDMAP_HAS_CUDA=1 " +
                   " ".join(copts) + " -c $(location " + src + ") -o $@"),
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        **kwargs
    )
