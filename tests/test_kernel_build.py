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
import shutil
import subprocess
import sysconfig

import pytest

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


NINJA_UNDEFINED = """Error building extension 'ext_v1': [1/3] /usr/local/cuda/bin/nvcc -c /b/cuda.cu -o cuda.cuda.o
FAILED: [code=2] cuda.cuda.o
/usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME=ext_v1 -I/tmp/error-cache/x -c /b/cuda.cu -o cuda.cuda.o
/b/cuda.cu(13): error: identifier "stride" is undefined
      for (int64_t i = start; i < n; i += stride) {
                                          ^

/b/cuda.cu(18): error: identifier "lane" is undefined

/b/cuda.cu(19): error: identifier "stride" is undefined

3 errors detected in the compilation of "/b/cuda.cu".
ninja: build stopped: subcommand failed.
"""


def test_undefined_names_are_a_builds_only_errors_or_none():
    assert kb.undefined_names(NINJA_UNDEFINED) == ["lane", "stride"]
    # as the worker reports it: positions pointed at the candidate's lines
    pointed = NINJA_UNDEFINED.replace("/b/cuda.cu(13):", "line 40 (cuda.cu:13):")
    assert kb.undefined_names(pointed) == ["lane", "stride"]
    assert kb.undefined_names(NINJA_UNDEFINED.replace("3 errors", "4 errors")) is None  # one not seen
    other = NINJA_UNDEFINED.replace('identifier "lane" is undefined', 'expected a ";"')
    assert kb.undefined_names(other) is None
    host = NINJA_UNDEFINED + "FAILED: main.o\n/b/main.cpp:3:1: error: 'x' does not name a type\n"
    assert kb.undefined_names(host) is None
    assert kb.undefined_names("") is None
    assert kb.cuda_unit_errors(NINJA_UNDEFINED) == {13: ['identifier "stride" is undefined'],
                                                   18: ['identifier "lane" is undefined'],
                                                   19: ['identifier "stride" is undefined']}
    typed = NINJA_UNDEFINED.replace('identifier "lane" is undefined', "type name is not allowed")
    assert kb.undefined_names(typed) is None and kb.cuda_unit_errors(typed)[18] == ["type name is not allowed"]
    assert kb.cuda_unit_errors(host) is None
    assert kb.cuda_unit_errors(NINJA_UNDEFINED.replace("3 errors", "4 errors")) is None
    # another file whose name ends in cuda.cu (a source's own #line can name one) is not the unit
    assert kb.cuda_unit_errors(NINJA_UNDEFINED.replace("/b/cuda.cu(18)", "/b/zcuda.cu(18)")) is None


def test_name_lookups_take_only_sources_whose_lookups_cannot_differ_from_the_probe():
    source = ("#include <torch/extension.h>\n#define BLOCK 256\nusing namespace at;\nnamespace mine {\n"
              "// a comment's words are no lookups\n__global__ void k(float* y, int64_t n) {\n"
              '  const char* m = "nor a string\'s"; float sum = y[0]; for (int64_t i = 0; i < n; i += stride)\n'
              "  y[i] = lane + y.__x + BLOCK + sum; }\n}\n")
    args = {"cuda_sources": [source], "extra_cflags": ["-O3"], "extra_cuda_cflags": ["-O3"]}
    found = kb.name_lookups(args, NINJA_UNDEFINED, ("-O3",))
    assert found["names"] == ["lane", "stride"] and found["namespaces"] == ["at", "mine"]
    assert found["directives"] == ["#include <torch/extension.h>", "#define BLOCK 256"]
    # the other identifiers, in order: no keyword, reserved or member name, none called or compared with <
    # (it could be a template), not the source's macro, no word of a comment or a string
    assert found["also"] == ["at", "mine", "y", "int64_t", "n", "m", "sum"]
    assert found["context"] == (kb.AS_WRITTEN_CUDA_PREFIX + "#include <torch/extension.h>\n#define BLOCK 256\n"
                                "namespace at {}\nnamespace mine {}\nnamespace kernel_eval_name_probe {\n"
                                "using namespace ::at;\nusing namespace ::mine;\n")
    refused = {
        "a conditional": source.replace("#define BLOCK 256", "#ifdef BLOCK\n#endif"),
        "a quoted include": source.replace("<torch/extension.h>", '"my.h"'),
        "a base class": source + "struct S : at::Tensor {};\n",
        "a namespace alias": source + "namespace t = torch;\n",
        "a name it does not write": source.replace("lane", "other"),
        # found by review: the probe looks a name up at namespace scope, so a macro's call or alias, a
        # qualified definition's scope (at::cuda, then at) or a raw string's quotes hiding code each found
        # as written what the probe called undeclared
        "a macro that is no number": source.replace("#define BLOCK 256", "#define BLOCK (256)"),
        "a function-like macro": source.replace("#define BLOCK 256", "#define BLOCK(x) x"),
        "a macro alias": source.replace("#define BLOCK 256", "#define BLOCK stride"),
        "a qualified definition": source + "int at::cuda::warp_size() { return lane; }\n",
        "a qualified member's": source + "void at::Tensor::kev() const { (void)stride; }\n",
        "an attribute after one": source + "const float c10::kev __attribute__((unused)) = 1.f;\n",
        "a raw string": source + 'const char* r = R"(")";\n',
    }
    for why, text in refused.items():
        assert kb.name_lookups(dict(args, cuda_sources=text), NINJA_UNDEFINED, ("-O3",)) is None, why
    assert kb.name_lookups(dict(args, extra_cuda_cflags=["-O3", "-DX"]), NINJA_UNDEFINED, ("-O3",)) is None
    # a name called or given template arguments (argument-dependent lookup, behind a comment too) is asked
    # of no probe; the others still are, each lookup its own; none left, no probe
    for why, text, left in (("a call", "void g() { stride(1); }\n", ["lane"]),
                            ("a call behind a comment", "void g() { stride /* call */ (1); }\n", ["lane"]),
                            ("a launch", "void g() { stride<<<1, 1>>>(); }\n", ["lane"]),
                            ("template arguments", "int v = lane<int>;\n", ["stride"])):
        found_left = kb.name_lookups(dict(args, cuda_sources=source + text), NINJA_UNDEFINED, ("-O3",))
        assert found_left["names"] == left and not set(found_left["also"]) & {"lane", "stride"}, why
    both = source + "void g() { stride(1); lane(2); }\n"
    assert kb.name_lookups(dict(args, cuda_sources=both), NINJA_UNDEFINED, ("-O3",)) is None
    assert kb.name_lookups(args, NINJA_UNDEFINED.replace("3 errors", "2 errors"), ("-O3",)) is None
    assert kb.name_lookups(dict(args, cuda_sources=source.replace("#define BLOCK 256", "#  define BLOCK 1e-5f")),
                           NINJA_UNDEFINED, ("-O3",))["names"] == ["lane", "stride"]   # a number: kept
    # undefined names beside a variable declared twice: the same lookups (the rules read the rest); any
    # other error, or a redeclaration alone (no name to look up): none
    redeclared = NINJA_UNDEFINED.replace('identifier "lane" is undefined', '"sum" has already been declared in the current scope')
    mixed = kb.name_lookups(args, redeclared, ("-O3",))
    assert mixed["names"] == ["stride"] and "lane" in mixed["also"]
    assert kb.name_lookups(args, redeclared.replace('identifier "stride" is undefined', 'expected a ";"'), ("-O3",)) is None
    # `lane < n)`: no `>` can close template arguments there, so it is no call; nvcc may say "expected a >"
    compared = dict(args, cuda_sources=source.replace("y[i] = lane +", "if (lane < n) y[i] ="))
    assert kb.name_lookups(compared, NINJA_UNDEFINED, ("-O3",))["names"] == ["lane", "stride"]
    unclosed = NINJA_UNDEFINED.replace('identifier "lane" is undefined', 'expected a ">"')
    assert kb.name_lookups(compared, unclosed, ("-O3",))["names"] == ["stride"]
    closable = dict(args, cuda_sources=source.replace("y[i] = lane +", "if (lane < n && n > 0) y[i] ="))
    assert kb.name_lookups(closable, NINJA_UNDEFINED, ("-O3",))["names"] == ["stride"]   # lane<n && n> may be template arguments
    only = redeclared.replace('identifier "stride" is undefined', '"sum" has already been declared in the current scope')
    assert kb.name_lookups(args, only, ("-O3",)) is None
    for directives, namespaces in ((["#if 1"], []), ([], ["a b"]), (["#include <a>\nint x;"], [])):
        with pytest.raises(ValueError):
            kb.name_probe_context(directives, namespaces)
    for names in ([], ["n;"], ["int"], ["__restrict__"], ["_Reserved"], ["my_error"], ["n", "n"], ["n"] * 40):
        with pytest.raises(ValueError):
            kb.name_probe_source(found["context"], names)


def test_a_probe_looks_up_each_name_on_lines_of_its_own():
    context = kb.name_probe_context(["#include <torch/extension.h>"], ["at"])
    probe, where = kb.name_probe_source(context, ["lane", "TORCH_CHECK"])
    lines = probe.split("\n")
    assert probe.startswith(context) and set(where) == {"lane", "TORCH_CHECK"}
    for name, (macro_line, lookup_line) in where.items():
        assert lines[macro_line - 2] == f"#if defined({name})" and "static_assert" in lines[macro_line - 1]
        assert lines[lookup_line - 1].endswith(f"{{ (void){name}; }}")
    assert lines[-3:] == ["#endif", "}", ""]


def test_name_probe_answers_are_read_line_by_line():
    """A name is "undeclared" only when its lookup line's only error is that its identifier is undefined;
    an error on its macro line, another error, or an error no name's lines account for: "declared"."""
    where = {"a": (10, 12), "b": (15, 17), "c": (20, 22), "d": (25, 27)}
    errors = {"12": ['identifier "a" is undefined'], "15": ["static assertion failed with \"a macro\""],
              "22": ["type name is not allowed"], "27": ['identifier "d" is undefined', "expected a \";\""]}
    assert kb.name_probe_answers(where, {"status": "compile_error", "cuda_errors": errors}) == {
        "a": "undeclared", "b": "declared", "c": "declared", "d": "declared"}
    stray = dict(errors, **{"3": ["cannot open source file"]})
    assert set(kb.name_probe_answers(where, {"status": "compile_error", "cuda_errors": stray}).values()) == {"declared"}
    assert set(kb.name_probe_answers(where, {"status": "compile_error"}).values()) == {"declared"}  # not by line
    assert kb.name_probe_answers(where, {"status": "ok"}) == dict.fromkeys(where, "declared")
    assert kb.name_probe_answers(where, {"status": "timeout"}) is None
    assert kb.name_probe_answers(where, {"status": "deferred"}) is None


def test_name_probes_are_answered_from_the_harness_compile_of_the_requests_parts(tmp_path):
    """One compile answers the request's names and the source's other identifiers ("also"), each by its
    own lines; a later request whose names were answered compiles nothing; a request of other forms
    compiles nothing; a compile that says nothing answers nothing."""
    compiled = []

    def compile_harness_source(src):  # as EDG would: Py_ names declared, M_ names macros, others undefined
        compiled.append(src)
        probe = eval(src.split("cuda_sources=")[1].split(", no_implicit_headers")[0])
        errors = {}
        for number, line in enumerate(probe.split("\n"), start=1):
            if match := re.search(r"\(void\)(\w+);", line):
                if not match.group(1).startswith(("Py_", "M_")):
                    errors[str(number)] = [f'identifier "{match.group(1)}" is undefined']
            elif "static_assert" in line and probe.split("\n")[number - 2].startswith("#if defined(M_"):
                errors[str(number)] = ['static assertion failed with "a macro"']
        if not errors:
            return {"status": "ok"}
        if "timeout_name" in probe:
            return {"status": "timeout"}
        return {"status": "compile_error", "message": "cut", "cuda_errors": errors}

    cache, parts = str(tmp_path), {"directives": ["#include <torch/extension.h>"], "namespaces": ["at"]}
    context = kb.name_probe_context(**parts)

    def answer(names):
        return kb.read_name_probe(cache, context, names)

    kb.answer_name_probes(dict(parts, names=["a_name", "z_name"], also=["Py_declared", "b_name", "M_macro"]),
                          cache, compile_harness_source)
    assert len(compiled) == 1 and "no_implicit_headers=True" in compiled[0]
    assert answer(["a_name", "z_name"]) == "undeclared" and answer(["b_name"]) == "undeclared"
    assert answer(["Py_declared"]) == "declared" and answer(["b_name", "M_macro"]) == "declared"
    assert answer(["c_name"]) is None and answer(["c_name", "Py_declared"]) == "declared"
    for names in (["b_name"], ["Py_declared", "a_name"], ["c_name", "M_macro"]):  # answered: no compile
        kb.answer_name_probes(dict(parts, names=names), cache, compile_harness_source)
    assert len(compiled) == 1
    kb.answer_name_probes(dict(parts, names=["c_name"], also=["a_name", "d_name"]), cache, compile_harness_source)
    assert len(compiled) == 2 and "(void)a_name;" not in compiled[1]  # only what is not answered yet
    assert answer(["c_name", "d_name"]) == "undeclared"
    other = {"directives": ["#include <torch/extension.h>"], "namespaces": []}  # another context: asked anew
    kb.answer_name_probes(dict(other, names=["a_name"]), cache, compile_harness_source)
    assert len(compiled) == 3 and kb.read_name_probe(cache, kb.name_probe_context(**other), ["a_name"]) == "undeclared"
    kb.answer_name_probes(dict(parts, names=["timeout_name"]), cache, compile_harness_source)
    assert len(compiled) == 4 and answer(["timeout_name"]) is None
    for bad in ({"names": ["x"], "directives": ["#if 1"], "namespaces": []}, {"names": ["x;y"]}, "names",
                dict(parts, names=["_Reserved"]), dict(parts, names=["a", "b", "c", "d", "e"]),
                dict(parts, names="x_name"), dict(parts, names=["x_name"], also="abc")):
        kb.answer_name_probes(bad, cache, compile_harness_source)
    assert len(compiled) == 4


FAKE_COMPILER = r"""#!/bin/sh
# logs the unit it compiles; fails a unit that names undefined_name, or needs_full_header without
# torch/types.h (what load_inline puts first in a .cu unit as written), as EDG would; else writes -o
for a; do case "$a" in *.cu|*.cpp) src="$a";; esac; done
out=""; prev=""; for a; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
[ -z "$out" ] && exec REAL "$@"
echo "$(basename "$0") $(basename "${src:-link}")" >> LOG
[ -n "$src" ] && grep -q slow_unit "$src" && sleep 20
if [ -n "$src" ] && { grep -q undefined_name "$src" || { grep -q needs_full_header "$src" && ! grep -q torch/types.h "$src"; }; }; then
  echo "$src(3): error: identifier \"undefined_name\" is undefined"
  echo "1 error detected in the compilation of \"$src\"."; exit 1
fi
touch "$out"
"""


def fake_toolchain(monkeypatch, tmp_path):
    """FAKE_COMPILER as nvcc and c++ for torch's real ninja builds: (its log, a cache root, new_worker), where
    new_worker(fast_load=False, **kw) patches load_inline afresh, as a new worker's torch would be."""
    import shutil
    import torch.utils.cpp_extension as ce
    log, cache = tmp_path / "log", tmp_path / "cache"
    cuda_home = tmp_path / "cuda"
    (cuda_home / "bin").mkdir(parents=True)
    (cuda_home / "lib64").mkdir()
    for path in (cuda_home / "bin" / "nvcc", tmp_path / "cxx"):
        path.write_text(FAKE_COMPILER.replace("LOG", str(log)).replace("REAL", shutil.which("c++")))
        path.chmod(0o755)
    monkeypatch.setenv("CXX", str(tmp_path / "cxx"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setattr(ce, "CUDA_HOME", str(cuda_home))
    for name in ("load_inline", "load", "remove_extension_h_precompiler_headers", "JIT_EXTENSION_VERSIONER",
                 "_run_ninja_build"):
        monkeypatch.setattr(ce, name, getattr(ce, name))
    inline, run_ninja = ce.load_inline, ce._run_ninja_build

    def new_worker(fast_load=False, config=None, **kw) -> dict:
        ce.load_inline, ce._run_ninja_build = inline, run_ninja
        ce.JIT_EXTENSION_VERSIONER = type(ce.JIT_EXTENSION_VERSIONER)()  # a new worker's torch
        return kb.patch_load_inline(str(cache), "9.0", config or kb.BuildConfig(host_pch=False),
                                    fast_load=fast_load, **kw)
    return log, cache, new_worker


def test_a_failed_unit_ends_the_build_and_a_tier_failure_still_builds_as_written(monkeypatch, tmp_path):
    """Real ninja, fake compilers that log each unit as it starts: a .cu unit that fails ends the build while
    its host unit (slow_unit: 20 s) still runs, and the error is that unit's; a source that fails its tier
    and builds as written still compiles and links both units (the same verdict)."""
    import time
    import torch.utils.cpp_extension as ce
    log, cache, new_worker = fake_toolchain(monkeypatch, tmp_path)
    new_worker(config=kb.BuildConfig(cuda_header_tiers=(), host_pch=False))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError) as failed:
        ce.load_inline("ext", "torch::Tensor f(torch::Tensor x); // slow_unit",
                       cuda_sources="__global__ void k(float* y) { y[0] = undefined_name; }")
    assert time.monotonic() - t0 < 15, "the build waited for its host unit"
    assert "FAILED: " in str(failed.value) and "cuda.cuda.o" in str(failed.value).split("FAILED: ")[1].split("\n")[0]
    assert 'identifier "undefined_name" is undefined' in str(failed.value)
    assert glob.glob(os.path.join(cache, "build", "*", "cuda.cuda.o")) == []
    assert glob.glob(os.path.join(cache, "build", "*", "main.o")) == []  # stopped, never written
    log.write_text("")
    new_worker()
    with pytest.raises(ImportError):  # the fake link writes an empty library: built, not importable
        ce.load_inline("ext", "torch::Tensor f(torch::Tensor x);",
                       cuda_sources="__global__ void k(float* y) { y[0] = 1.f; } // needs_full_header")
    started = [line for line in log.read_text().split("\n") if line]  # as written: .cu unit first (its tier failed there)
    assert started[-3:] == ["nvcc cuda.cu", "cxx main.cpp", "cxx link"], started


def test_host_unit_after_device_unit_orders_only_a_build_with_both(tmp_path):
    ninja = tmp_path / "build.ninja"
    both = ("build main.o: compile /b/main.cpp\nbuild cuda.cuda.o: cuda_compile /b/cuda.cu\n\n"
            "build ext.so: link main.o cuda.cuda.o\n")
    ninja.write_text(both)
    assert kb.host_unit_after_device_unit(str(ninja))
    assert ninja.read_text() == both.replace("/b/main.cpp\n", "/b/main.cpp || cuda.cuda.o\n", 1)
    host_only = "build main.o: compile /b/main.cpp\n\nbuild ext.so: link main.o\n"
    ninja.write_text(host_only)
    assert not kb.host_unit_after_device_unit(str(ninja)) and ninja.read_text() == host_only


def test_a_tier_failure_on_unanswered_names_waits_for_their_probe_and_undeclared_skips_the_build_as_written(
        monkeypatch, tmp_path):
    """Real ninja, fake compilers that log each unit they compile: a source that fails on the slim tier with an
    undefined name no probe has answered asks for the probe (await_name_probe) and waits, as kernel_eval's
    compile workers do; then "undeclared" hands the name to the early-verdict rules (here a stand-in that
    explains this name alone), whose verdict is the error with no second build; "declared" means the build
    as written, a worker asks once, and a builder that does not wait for probes builds as written at once.
    With early verdicts off no probe is asked: an answer is never a verdict alone."""
    import torch.utils.cpp_extension as ce
    log, cache, new_worker = fake_toolchain(monkeypatch, tmp_path)
    rules_read = []

    def early_verdict(args, tier_args, tier_error, lean_ops, timeout_s, *, dropped, expanded, undeclared):
        rules_read.append(sorted(undeclared))
        return "undefined" if undeclared == {"undefined_name"} else None
    monkeypatch.setattr(kb, "early_verdict", early_verdict)
    answer_path = kb.name_probe_path(str(cache), kb.name_probe_context([], []), "undefined_name")
    requests, answers = [], []

    def await_name_probe(request):  # kernel_eval's part: compile the probe, keep its answer
        requests.append(request)
        if answers:
            os.makedirs(os.path.dirname(answer_path), exist_ok=True)
            open(answer_path, "w").write(answers.pop(0))

    def units_compiled(state, source) -> list:
        log.write_text("")
        state.update(build_error=None)
        with pytest.raises((RuntimeError, ImportError)):
            ce.load_inline("ext", "torch::Tensor f(torch::Tensor x);", cuda_sources=source)
        return log.read_text().split("\n").count("nvcc cuda.cu")  # builds of the .cu unit

    source = "__global__ void k(float* y) { y[0] = undefined_name; }"
    answers.append("undeclared")
    worker = new_worker(await_name_probe=await_name_probe)
    assert units_compiled(worker, source) == 1  # the slim tier; the probe asked for and answered; no second build
    assert requests == [{"names": ["undefined_name"], "also": ["y"], "directives": [], "namespaces": []}]
    assert 'identifier "undefined_name" is undefined' in worker["build_error"]
    assert rules_read == [[], ["undefined_name"]] and worker["early_verdict"] == "undefined"  # before and after
    source += " // again"  # a new source, a new worker: the answer is read, nothing asked
    assert units_compiled(new_worker(await_name_probe=await_name_probe), source) == 1 and len(requests) == 1
    assert rules_read[2:] == [["undefined_name"]]
    monkeypatch.setattr(kb, "early_verdict", lambda *a, **kw: rules_read.append("refused"))  # the rules say no
    source += " // refused"
    assert units_compiled(new_worker(await_name_probe=await_name_probe), source) == 2 and len(requests) == 1
    monkeypatch.setattr(kb, "early_verdict", early_verdict)
    source += " // no early verdicts"
    off = new_worker(await_name_probe=await_name_probe, config=kb.BuildConfig(host_pch=False, early_verdicts=False))
    assert units_compiled(off, source) == 2 and len(requests) == 1 and rules_read[-1] == "refused"
    os.remove(answer_path)
    answers.append("declared")
    source += " // declared"
    worker = new_worker(await_name_probe=await_name_probe)
    assert units_compiled(worker, source) == 2 and len(requests) == 2  # the slim tier, the probe, then as written
    os.remove(answer_path)
    source += " // twice"  # a worker asks once: kernel_eval answers one request a worker
    assert units_compiled(worker, source) == 2 and len(requests) == 2
    source += " // unanswered"  # a probe that said nothing (its compile gave no verdict): as written
    assert units_compiled(new_worker(await_name_probe=await_name_probe), source) == 2 and len(requests) == 3
    source += " // and again"
    assert units_compiled(new_worker(), source) == 2 and len(requests) == 3  # no prober: slim, then as written

    # a run worker imports what its compile worker built as written after a failed tier, which torch's
    # versioner named ext_v1 (the tier's build was that worker's first of the name); the run worker skips
    # the tier (remembered), so it would have named its own build ext and built again
    written = "__global__ void k(float* y) { y[0] = 1.f; } // needs_full_header"
    assert units_compiled(new_worker(), written) == 2  # the slim tier failed, as written built (an empty library)
    imported = []
    monkeypatch.setattr(ce, "_import_module_from_library", lambda name, path, python_module: imported.append(
        (name, sorted(os.listdir(path)))) or name)
    new_worker(fast_load=True)
    log.write_text("")
    ce.load_inline("ext", "torch::Tensor f(torch::Tensor x);", cuda_sources=written)
    assert log.read_text() == "" and [name for name, _ in imported] == ["ext_v1"] and "ext_v1.so" in imported[0][1]


def test_the_probes_host_unit_builds_an_importable_module(tmp_path):
    """A probe that builds (its names declared) must import, or its compile says nothing ("deferred")."""
    import torch.utils.cpp_extension as ce
    module = ce.load_inline("kernel_eval_name_probe", kb.PROBE_HOST_UNIT, no_implicit_headers=True,
                            build_directory=str(tmp_path))
    assert module.__name__ == "kernel_eval_name_probe"


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc")
def test_name_probes_compiled_by_nvcc_say_undeclared_only_for_a_failed_lookup(tmp_path):
    """The probe as nvcc sees it (torch's headers as load_inline writes a .cu unit, torch's flags): each
    name nothing declares fails its own lookup; a macro of torch's headers, a type, a namespace and a
    declared variable or overloaded function do not, and do not disturb the other names' answers."""
    import torch.utils.cpp_extension as ce
    flags = ["-std=c++17", "--expt-relaxed-constexpr", "-DTORCH_API_INCLUDE_EXTENSION_H"] + [
        f"-I{p}" for p in ce.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    expected = {"kernel_eval_a": "undeclared", "TORCH_CHECK": "declared", "int64_t": "declared",
                "kernel_eval_b": "undeclared", "torch": "declared", "PyType_Type": "declared",
                "threadIdx": "declared", "abs": "declared", "lane": "undeclared"}
    probe, where = kb.name_probe_source(kb.name_probe_context(["#include <torch/extension.h>"], ["at"]),
                                        list(expected))
    unit = tmp_path / "cuda.cu"
    unit.write_text(probe)
    done = subprocess.run(["nvcc", "-c", str(unit), "-o", str(tmp_path / "x.o")] + flags,
                          capture_output=True, text=True, timeout=600)
    dump = (done.stdout + done.stderr).replace(str(unit), "/b/cuda.cu")
    assert done.returncode != 0 and kb.cuda_unit_errors(dump), dump[-2000:]
    record = {"status": "compile_error", "cuda_errors": kb.cuda_unit_errors(dump)}
    assert kb.name_probe_answers(where, record) == expected, dump[-3000:]


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




def test_the_harness_and_its_workers_name_the_same_host_header(tmp_path, monkeypatch):
    """The parent (no torch imported) binds the header's folder into a confined worker, which writes the
    header there if missing: both must name one folder even where torch.__version__ carries a local suffix
    its metadata lacks (torch 2.11's CUDA 13 build: "2.11.0+cu130" against "2.11.0")."""
    import torch
    parent = kb.write_host_header(str(tmp_path))
    monkeypatch.setattr(torch, "__version__", torch.__version__ + "+cu130")
    assert kb.write_host_header(str(tmp_path)) == parent


@pytest.mark.slow
def test_host_pch_is_built_from_the_units_flags_and_used_by_another_extension(tmp_path):
    """build_host_pch reads the flags torch wrote for a build and precompiles the header with them;
    a unit of another extension (another TORCH_EXTENSION_NAME, other -I paths) then reads it."""
    import shutil
    import sysconfig
    import torch.utils.cpp_extension as ce
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    header = kb.write_host_header(str(tmp_path))
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


def builds_in(cache: str, extension: str) -> int:
    """How many builds in a harness cache (their build.ninja) named an extension that holds `extension`."""
    return sum(extension in open(p).read().split("TORCH_EXTENSION_NAME=")[1].split()[0]
               for p in glob.glob(os.path.join(cache, "**", "build", "*", "build.ninja"), recursive=True))


@pytest.mark.gpu
def test_cuda_undefined_names_are_probed_once_then_cost_only_the_slim_build(tmp_path):
    """Through evaluate: a kernel that uses `stride` without declaring it fails on the slim tier; torch's
    headers spell stride (at::Tensor's), so no rule reads it alone: it is probed (with the source's other
    identifiers), answered "undeclared", and the rules, the name taken as undefined, make the kernel a
    compile error without a build as written; a new kernel with the same name is then a compile error
    after the slim build alone. A name the full headers declare (Python's PyType_Type, which
    torch/extension.h brings) is probed "declared" and its kernel built as written."""
    benign = open(os.path.join(ADV, "cuda", "benign.py")).read()
    broken = benign.replace("    float v = in[i];", "    float v = in[i] * stride;", 1)
    assert broken != benign
    rescued = benign.replace("    auto xc = x.contiguous();", "    TORCH_CHECK(&PyType_Type != nullptr);\n"
                             "    auto xc = x.contiguous();", 1).replace('name="ext"', 'name="ext_rescued"')
    cache = str(tmp_path / "cache")

    def answers(name: str) -> list:
        return sorted(open(p).read() for p in glob.glob(os.path.join(cache, "name_probes", "*", name)))

    def probes() -> int:  # the probe's own builds
        return builds_in(cache, "kernel_eval_name_probe")

    first = kernel_eval.evaluate(REFERENCE, broken.replace('name="ext"', 'name="ext_first"'), device="cuda",
                                 cache_root=cache, gpu_trials=30)
    assert first.status == "compile_error" and 'identifier "stride" is undefined' in first.message, first.message
    assert first.early_verdict == "undefined"
    assert answers("stride") == ["undeclared"] and builds_in(cache, "ext_first") == 1  # slim, then probe, then the rules
    assert 0.0 < first.seconds["compile.probe"] < first.seconds["compile"], first.seconds  # the probe's wait, reported
    assert answers("spin_cycles") == ["undeclared"] and answers("cudaStream_t") == ["declared"]  # looked up too
    assert probes() == 1
    second = kernel_eval.evaluate(REFERENCE, broken.replace('name="ext"', 'name="ext_second"'), device="cuda",
                                  cache_root=cache, gpu_trials=30)
    assert second.status == "compile_error" and second.early_verdict == "undefined", second.message
    assert builds_in(cache, "ext_second") == 1 and probes() == 1  # the slim tier alone
    assert "compile.probe" not in second.seconds and second.seconds["compile.build"] > 0, second.seconds
    result = kernel_eval.evaluate(REFERENCE, rescued, device="cuda", cache_root=cache, gpu_trials=30)
    assert result.status == "correct", result.message  # probed "declared" (the probe built or failed otherwise)
    assert answers("PyType_Type") == ["declared"] and builds_in(cache, "ext_rescued") == 2  # the slim tier, as written
    both = rescued.replace("    float v = in[i];", "    float v = in[i] * stride;", 1)
    result = kernel_eval.evaluate(REFERENCE, both.replace("ext_rescued", "ext_both"), device="cuda",
                                  cache_root=cache, gpu_trials=30)
    assert result.status == "compile_error" and builds_in(cache, "ext_both") == 2, result.message  # one name declared


@pytest.mark.gpu
def test_cuda_a_line_pasted_over_a_declaration_costs_only_the_slim_build_once_probed(tmp_path):
    """Through evaluate, early verdicts on: a line pasted over the declaration of `stride` (a name torch's
    headers spell, so no early rule reads it alone) leaves `start` declared twice and `stride` undefined.
    The first such kernel waits for its name probe, then is judged by the rules (no build as written);
    the next one of that context is judged after the slim build alone."""
    benign = open(os.path.join(ADV, "cuda", "benign.py")).read()
    cache = str(tmp_path / "cache")
    declaration = "    const int64_t stride = (int64_t)gridDim.x * blockDim.x;\n"
    kernel = ("__global__ void pasted_kernel(float* y, int64_t n) {\n"
              "    const int64_t start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n" + declaration
              + "    for (int64_t i = start; i < n; i += stride) y[i] = 0.f;\n}\n\n")
    assert "__global__" in benign
    with_kernel = benign.replace("__global__", kernel + "__global__", 1)
    pasted = with_kernel.replace(declaration, "    const int64_t start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n")

    intact = kernel_eval.evaluate(REFERENCE, with_kernel.replace('name="ext"', 'name="ext_intact"'), device="cuda",
                                  cache_root=cache, gpu_trials=30)
    assert intact.status == "correct", intact.message   # the kernel as it was builds and is never called
    for k, extension in enumerate(("ext_first", "ext_second")):
        result = kernel_eval.evaluate(REFERENCE, pasted.replace('name="ext"', f'name="{extension}"'), device="cuda",
                                      cache_root=cache, gpu_trials=30)
        assert result.status == "compile_error" and result.early_verdict == "redeclared+undefined", result.message
        assert '"start" has already been declared' in result.message and 'identifier "stride"' in result.message
        assert builds_in(cache, extension) == 1, extension
        assert ("compile.probe" in result.seconds) == (k == 0), result.seconds
