"""Tests for kernel_build: the load_inline patch (per-hash build directories, -O3, the precompiled
header lock), the CUDA header tiers and their fallback, lean op headers, the host units' precompiled
header, and compiler diagnostics pointed at the candidate's lines. load_inline is replaced by a
fake that records its arguments where a build would only cost time; the slow and gpu tests compile."""
import functools
import glob
import json
import os
import re
import shlex
import subprocess

import pytest
import torch

import kernel_build as kb
import kernel_eval

HERE = os.path.dirname(os.path.abspath(__file__))
ADV = os.path.join(HERE, "adversarial")
REFERENCE = open(os.path.join(ADV, "reference.py")).read()


def unit_tier(kw: dict) -> str:
    """Which header set a fake build was asked to compile under."""
    if not kw.get("no_implicit_headers"):
        return "as written"
    return "light" if "ATen/ATen.h" in "".join(kw["cuda_sources"]) else "slim"


def test_build_config_refuses_unknown_header_tiers():
    for tiers in (("tiny",), "slim", ("slim", "heavy")):
        with pytest.raises(ValueError, match="cuda_header_tiers"):
            kb.BuildConfig(cuda_header_tiers=tiers)
    assert kb.BuildConfig(cuda_header_tiers=["light"]).cuda_header_tiers == ("light",)  # as JSON brings it


def test_cuda_header_tiers_rewrite_and_fall_back(monkeypatch, tmp_path):
    """A CUDA unit is tried on each tier in order, then as written; a tier it failed on is
    remembered (FAILED in its build directory) and not tried again for the same source."""
    import torch.utils.cpp_extension as ce
    attempts = []

    def fake(**kw):
        attempts.append(unit_tier(kw))
        unit = "".join(kw["cuda_sources"]) if kw.get("no_implicit_headers") else ""
        if "needs_aten" in unit and "ATen/ATen.h" not in unit or "needs_full_header" in unit:
            raise RuntimeError("error: 'torch::nn' has not been declared")
        fake.last = kw
        return kw["build_directory"]

    monkeypatch.setattr(ce, "load_inline", functools.wraps(ce.load_inline)(fake))
    monkeypatch.setattr(ce, "load", ce.load)
    monkeypatch.setattr(ce, "remove_extension_h_precompiler_headers", ce.remove_extension_h_precompiler_headers)
    monkeypatch.setattr(kb, "PCH_LOCK_DIR", str(tmp_path))
    kb.patch_load_inline(str(tmp_path), "9.0", kb.BuildConfig(use_pch=True, cuda_header_tiers=("slim", "light"),
                                                              host_pch=False), fast_load=False)

    def tried(cuda_source: str) -> list:
        attempts.clear()
        ce.load_inline("ext", "", cuda_sources=cuda_source)
        return list(attempts)

    attempts.clear()
    ce.load_inline("ext", "#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x);",
                   cuda_sources="#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n__global__ void k() {}\n"
                                "torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x); return at::zeros_like(y); }")
    assert attempts == ["slim"]
    cu, cpp = "".join(fake.last["cuda_sources"]), "".join(fake.last["cpp_sources"])
    assert "torch/extension.h" not in cu + cpp and "ATen/ATen.h" not in cu and "__global__ void k" in cu
    assert kb.CUDA_CONTEXT_HEADER not in cu and kb.SLIM_CUDA_CONTEXT in cu  # no cuBLAS/cuSPARSE headers
    # the ops the unit names, and only those, from a lean copy first on the include path
    assert "ATen/ops/empty_like.h" in cu and "ATen/ops/zeros_like.h" in cu and "ATen/ops/empty.h>" not in cu
    lean = fake.last["extra_include_paths"][0]
    assert sorted(os.listdir(os.path.join(lean, "ATen", "ops"))) == ["empty_like.h", "zeros_like.h"]
    assert "torch/csrc/Exceptions.h" in cpp and "torch::Tensor f" in cpp and "using namespace at" in cpp
    assert tried("// needs_aten") == ["slim", "light"]  # slim failed, light built
    light_host = "".join(fake.last["cpp_sources"])  # torch/extension.h defines torch::kFloat32 itself
    assert "torch/extension.h" in light_host and "kFloat32" not in light_host
    written = "#include <torch/extension.h>\n// needs_full_header"
    assert tried(written) == ["slim", "light", "as written"]
    assert fake.last["cuda_sources"] == written  # the call as the candidate wrote it
    assert tried(written) == ["as written"]  # the failed tiers are remembered, not retried


def test_patched_load_inline_hashes_build_dirs_and_injects_flags(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as ce
    calls = []
    fake = functools.wraps(ce.load_inline)(lambda **kw: calls.append(kw) or kw["build_directory"])
    monkeypatch.setattr(ce, "load_inline", fake)  # keeps the real signature for the wrapper to bind
    monkeypatch.setattr(ce, "load", ce.load)
    monkeypatch.setattr(ce, "remove_extension_h_precompiler_headers", ce.remove_extension_h_precompiler_headers)
    monkeypatch.setattr(ce, "_check_and_build_extension_h_precompiler_headers", lambda *a, **k: None)
    monkeypatch.setattr(kb, "PCH_LOCK_DIR", str(tmp_path))
    kb.patch_load_inline(str(tmp_path), "", kb.BuildConfig(use_pch=True, cuda_header_tiers=(), host_pch=False),
                         fast_load=False)
    dir_a = ce.load_inline("ext", "int a;", functions=["f"])
    dir_b = ce.load_inline("ext", "int b;", functions=["f"])
    open(os.path.join(dir_a, "lock"), "w").close()  # torch's baton, left by a killed build
    dir_a2 = ce.load_inline("ext", "int a;", functions=["f"])
    assert not os.path.exists(os.path.join(dir_a, "lock"))
    assert dir_a != dir_b and dir_a == dir_a2  # same name, different code: never the same library
    assert calls[0]["extra_cflags"] == ["-O3"] and calls[0]["use_pch"] is True
    ce.load_inline("ext", "int a;", extra_cflags=["-O1", "-march=native"])
    assert calls[-1]["extra_cflags"] == ["-O1", "-march=native"] and calls[-1]["use_pch"] is False
    ce.load_inline("ext", "int a;", cuda_sources="__global__ void k() {}")
    assert "-O3" in calls[-1]["extra_cuda_cflags"] and calls[-1]["use_pch"] is False




def test_slim_host_units_include_the_shared_header_first(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as ce
    calls = []
    monkeypatch.setattr(ce, "load_inline", functools.wraps(ce.load_inline)(lambda **kw: calls.append(kw) or kw["build_directory"]))
    monkeypatch.setattr(ce, "load", ce.load)
    monkeypatch.setattr(ce, "remove_extension_h_precompiler_headers", ce.remove_extension_h_precompiler_headers)
    kb.patch_load_inline(str(tmp_path), "9.0", kb.BuildConfig(use_pch=False, cuda_header_tiers=("slim",), host_pch=True),
                         fast_load=False)
    for name in ("ext_a", "ext_b"):
        ce.load_inline(name, "torch::Tensor f(torch::Tensor x);", cuda_sources="__global__ void k() {}")
    first_lines = {"".join(c["cpp_sources"]).splitlines()[0] for c in calls}
    assert len(first_lines) == 1  # one header for every unit of this torch, so one precompiled form
    header = first_lines.pop().removeprefix('#include "').removesuffix('"')
    assert header.startswith(str(tmp_path)) and open(header).read() == kb.SLIM_HOST_HEADERS
    # no build.ninja in these fake builds: nothing to learn the flags from, so no precompiled header
    assert not os.path.exists(header + ".gch")




@pytest.mark.slow
def test_host_pch_is_built_from_the_units_flags_and_used_by_another_extension(tmp_path):
    """build_host_pch reads the flags torch wrote for a build and precompiles the header with them;
    a unit of another extension (another TORCH_EXTENSION_NAME, other -I paths) then reads it."""
    import shutil
    import sysconfig
    import torch.utils.cpp_extension as ce
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    header = kb.write_host_header(str(tmp_path), torch.__version__)
    system = [f"-isystem {p}" for p in ce.include_paths()] + [f"-isystem {sysconfig.get_paths()['include']}"]
    build = tmp_path / "build_a"
    build.mkdir()

    def ninja(cflags: str) -> None:
        (build / "build.ninja").write_text(f"ninja_required_version = 1.3\ncxx = c++\n\ncflags = {cflags}\npost_cflags = \n")

    ninja("-DTORCH_EXTENSION_NAME=ext_a -DTORCH_API_INCLUDE_EXTENSION_H -I/no/such/dir -std=c++17 --no-such-flag "
          + " ".join(system))
    assert not kb.build_host_pch(header, str(build))  # the compiler refused: nothing written, nothing left
    assert sorted(os.listdir(os.path.dirname(header))) == ["kernel_eval_host.h", "kernel_eval_host.h.lock"]
    flags = "-DTORCH_API_INCLUDE_EXTENSION_H " + " ".join(system) + " -fPIC -std=c++17 -O3"
    ninja("-DTORCH_EXTENSION_NAME=ext_a -I/no/such/dir " + flags)
    assert kb.build_host_pch(header, str(build))
    assert not kb.build_host_pch(header, str(build))  # built once
    unit = tmp_path / "main.cpp"
    unit.write_text(f'#include "{header}"\n' + kb.TORCH_ALIASES + "torch::Tensor f(torch::Tensor x) { return x; }\n")
    done = subprocess.run(["c++", "-DTORCH_EXTENSION_NAME=ext_b", f"-I{tmp_path}", *shlex.split(flags),
                           "-Winvalid-pch", "-H", "-fsyntax-only", str(unit)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"! {header}.gch" in done.stderr.splitlines()  # g++ marks a precompiled header it used with "!"




def test_lean_op_headers_drop_only_the_unused_includes_and_compile(tmp_path):
    import shutil
    import torch.utils.cpp_extension as ce
    ops_dir = os.path.join(ce.include_paths()[0], "ATen", "ops")
    names = kb.op_names(["auto y = torch::empty_like(x); at::zeros({2}, x.options()); torch::nope(x); "
                         "torch::Tensor(x); at::matmul (x, x);"], ops_dir)
    assert names == ["empty_like", "matmul", "zeros"]  # no header for nope; Tensor is not an op
    include_dir = kb.write_lean_op_headers(names, ops_dir, str(tmp_path))
    assert kb.write_lean_op_headers(names, ops_dir, str(tmp_path)) == include_dir  # same names, same dir
    for n in names:
        with open(os.path.join(ops_dir, n + ".h")) as f:
            full = f.read().splitlines()
        with open(os.path.join(include_dir, "ATen", "ops", n + ".h")) as f:
            lean = f.read().splitlines()
        assert lean == [line for line in full if line.strip() not in kb.LEAN_OP_DROPPED]
        assert len(full) - len(lean) == len(kb.LEAN_OP_DROPPED)  # each dropped include was there
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    # the wrappers still compile from the slim host headers alone (g++ parses them as the .cu unit would)
    src = tmp_path / "unit.cpp"
    src.write_text(kb.SLIM_HOST_HEADERS + kb.ops_includes(names) + kb.TORCH_ALIASES
                   + "torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x);"
                   " return torch::matmul(y, torch::zeros({2, 2}, x.options())); }\n")
    flags = [f"-I{include_dir}"] + [f"-isystem{p}" for p in ce.include_paths()]
    import sysconfig
    flags.append(f"-isystem{sysconfig.get_paths()['include']}")
    done = subprocess.run(["c++", "-std=c++17", "-fsyntax-only", *flags, str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]




def test_point_at_source_maps_generated_lines_to_the_candidates_file(tmp_path):
    build = tmp_path / "build" / "abc"
    build.mkdir(parents=True)
    (build / "main.cpp").write_text("#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x) {\n"
                                    "    return undefined_thing(x);\n}\n// bindings\n")
    py = 'import torch\nsrc = """\ntorch::Tensor f(torch::Tensor x) {\n    return undefined_thing(x);\n}\n"""\n'
    diag = (f"{build}/main.cpp:3:12: error: 'undefined_thing' was not declared in this scope\n"
            "    3 |     return undefined_thing(x);\n"
            f"{build}/main.cpp:1:10: fatal error: no such header\n"
            f"{build}/cuda.cu(7): error: identifier is undefined\n"
            "/usr/include/torch/x.h:3:1: note: a header's own line is left alone")
    out = kb.point_at_source(diag, py).splitlines()
    assert out[0] == "line 4 (main.cpp:3:12): error: 'undefined_thing' was not declared in this scope"
    assert out[1] == "    4 |     return undefined_thing(x);"  # gcc's quote of the line, renumbered
    assert out[2] == "main.cpp:1:10: fatal error: no such header"  # the harness's header: no .py line
    assert out[3] == "cuda.cu:7: error: identifier is undefined"  # no such generated file here
    assert out[4] == "/usr/include/torch/x.h:3:1: note: a header's own line is left alone"




@pytest.mark.gpu
def test_cuda_slim_tier_builds_cuda_context_users_and_precompiles_the_host_headers(tmp_path):
    """A source that includes ATen/cuda/CUDAContext.h and calls its device-property functions and
    AT_CUDA_CHECK builds on the slim tier (SLIM_CUDA_CONTEXT), and the host headers' precompiled form
    that the batch leaves (built by the harness's own compile, kernel_build.warm_host_pch, where
    candidates are confined; else by the first slim build) is valid for the flags torch gives a host
    unit on this machine."""
    src = open(os.path.join(ADV, "cuda", "benign.py")).read().replace('name="ext"', 'name="ext_context"')
    src = src.replace("#include <c10/cuda/CUDAStream.h>", "#include <ATen/cuda/CUDAContext.h>")
    src = src.replace("    auto y = torch::empty_like(xc);\n    launch(xc, y, scale, 0, xc.numel(), ",
                      "    TORCH_CHECK(at::cuda::getCurrentDeviceProperties()->multiProcessorCount > 0);\n"
                      "    TORCH_CHECK(at::cuda::warp_size() == 32);\n"
                      "    auto y = torch::empty_like(xc);\n    launch(xc, y, scale, 0, xc.numel(), ", 1)
    src = src.replace("    return y;\n}\n\n// partial", "    AT_CUDA_CHECK(cudaGetLastError());\n    return y;\n}\n\n// partial", 1)
    assert src.count("getCurrentDeviceProperties") == 1 and src.count("AT_CUDA_CHECK") == 1
    cache = str(tmp_path / "cache")
    result = kernel_eval.evaluate(REFERENCE, src, device="cuda", cache_root=cache, gpu_trials=30)
    assert result.status == "correct", result.message
    records = [json.load(open(p)) for p in glob.glob(os.path.join(cache, "compiled", "*.json"))]
    assert records and all(r["header_tier"] == "slim" for r in records), records
    [gch] = glob.glob(os.path.join(cache, "host_pch", "*", "kernel_eval_host.h.gch"))
    [build_dir] = [os.path.dirname(p) for p in glob.glob(os.path.join(cache, "**", "build", "*", "build.ninja"),
                                                         recursive=True) if "ext_context" in open(p).read()]
    ninja = open(os.path.join(build_dir, "build.ninja")).read()
    cxx, cflags = (re.search(rf"^{v} = (.*)$", ninja, re.M).group(1) for v in ("cxx", "cflags"))
    done = subprocess.run([*shlex.split(cxx), *shlex.split(cflags), "-Winvalid-pch", "-H", "-fsyntax-only",
                           os.path.join(build_dir, "main.cpp")], capture_output=True, text=True)
    assert done.returncode == 0 and f"! {gch}" in done.stderr.splitlines(), done.stderr[-2000:]
