"""Detects the CUDA toolkit so CUDA code is built when it is there and skipped when it is not.

The repository `@local_cuda` always defines the same targets:
  :cuda_headers  the toolkit's host headers; defines SHARDMAP_HAS_CUDA=1 when present
  :cudart        CUDA runtime
  :cublaslt      cuBLASLt
  :nccl          NCCL
  :nvcc          the compiler (empty filegroup when absent)
and `defs.bzl` with CUDA_AVAILABLE and CUDA_PATH. Without a toolkit every library is empty, so
code guarded by `#if SHARDMAP_HAS_CUDA` compiles to its CPU-only form.

The toolkit is looked up in $CUDA_PATH, else /usr/local/cuda. Point CUDA_PATH at a missing folder
to build as if there were no toolkit.
"""

_PRESENT = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda_headers",
    hdrs = glob([
        "include/*.h",
        "include/*.hpp",
        "include/crt/**",
        "include/nv/**",
        "include/nccl_device/**",
    ]),
    includes = ["include"],
    defines = ["SHARDMAP_HAS_CUDA=1"],
)

cc_library(
    name = "cudart",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcudart", "-ldl", "-lrt", "-lpthread"],
    deps = [":cuda_headers"],
)

cc_library(
    name = "cublaslt",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lcublasLt"],
    deps = [":cudart"],
)

cc_library(
    name = "nccl",
    linkopts = ["-L{lib}", "-Wl,-rpath,{lib}", "-lnccl"],
    deps = [":cudart"],
)

filegroup(
    name = "nvcc",
    srcs = ["bin/nvcc"],
)
"""

_ABSENT = """
package(default_visibility = ["//visibility:public"])

cc_library(name = "cuda_headers")

cc_library(name = "cudart")

cc_library(name = "cublaslt")

cc_library(name = "nccl")

filegroup(name = "nvcc")
"""

def _cuda_configure_impl(rctx):
    cuda_path = rctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    root = rctx.path(cuda_path)
    present = (root.exists and
               rctx.path(cuda_path + "/bin/nvcc").exists and
               rctx.path(cuda_path + "/include/cuda_runtime.h").exists)
    if present:
        rctx.symlink(cuda_path + "/include", "include")
        rctx.symlink(cuda_path + "/bin", "bin")
        lib = str(rctx.path(cuda_path + "/lib64").realpath)
        rctx.file("BUILD.bazel", _PRESENT.replace("{lib}", lib))
    else:
        rctx.file("BUILD.bazel", _ABSENT)
    rctx.file("defs.bzl", "CUDA_AVAILABLE = %s\nCUDA_PATH = %r\n" % (present, cuda_path if present else ""))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_PATH"],
    local = True,
)
