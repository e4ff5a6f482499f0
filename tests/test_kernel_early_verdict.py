"""Tests for kernel_early_verdict: the rules by which a CUDA source's failure on a header tier is its
verdict (brackets that do not pair up, a name no header spells, a variable declared twice in a block),
read from the unit as written preprocessed; the slow test runs nvcc -E, the gpu test goes through evaluate."""
import glob
import os
import shutil
import sysconfig

import pytest

import kernel_build as kb
import kernel_early_verdict as kev
import kernel_eval

HERE = os.path.dirname(os.path.abspath(__file__))
ADV = os.path.join(HERE, "adversarial")
REFERENCE = open(os.path.join(ADV, "reference.py")).read()


def test_brackets_unbalanced_counts_the_grammars_brackets_only():
    """Brackets in string and character literals, raw strings, digit separators and directive lines are no
    tokens of the grammar's; a digraph (<: is [) makes the count unsure."""
    balanced = ('# 1 "cuda.cu"\n#pragma unroll (4\nint f(int a) { const char* s = "(]{"; char c = \'(\';\n'
                'auto r = R"x(a) ")x"; long n = 1\'000\'000; return a[0] + n; }\n')
    assert kev.brackets_unbalanced(balanced) is None
    assert kev.brackets_unbalanced(balanced.replace("a[0]", "a[0")) == "1 more '[' than ']'"
    assert kev.brackets_unbalanced(balanced.replace("int a)", "int a))")) == "1 more ')' than '('"
    assert kev.brackets_unbalanced(balanced.replace("return", "{ return")) == "1 more '{' than '}'"
    assert kev.brackets_unbalanced(balanced.replace("a[0]", "a<:0]")) is None  # <: is [ : balanced, unsure
    assert kev.brackets_unbalanced("std::vector<::x> v;(") == "1 more '(' than ')'"  # <:: is < ::
    assert kev.brackets_unbalanced('auto s = R"x"( ( )x"";') is None  # a raw string's delimiter may hold a quote
    assert kev.brackets_unbalanced("int a = 1 ' (;") is None  # a quote outside any literal read: unsure


# A slim tier's failure as torch 2.11's headers report it (an H100's demo kernel): an overload's details and
# the echoed source lines say "error" and "Error", a header's note and a warning of the unit follow
TIER_DUMP_211 = """Error building extension 'ext': [1/2] /usr/local/cuda/bin/nvcc -c /b/cuda.cu -o cuda.cuda.o
FAILED: cuda.cuda.o
/usr/local/cuda/bin/nvcc -DTORCH_EXTENSION_NAME=ext -c /b/cuda.cu -o cuda.cuda.o
/b/cuda.cu(67): error: identifier "cols" is undefined
      const int64_t batch = x.size(0), reduce = x.size(1, cols = x.size(2); cudaError_t e = cudaGetLastError();
                                                          ^

/b/cuda.cu(67): error: expected a ")"
      const int64_t batch = x.size(0), reduce = x.size(1, cols = x.size(2); cudaError_t e = cudaGetLastError();
                                                                          ^

/b/cuda.cu(67): error: no instance of overloaded function "at::Tensor::size" matches the argument list
            argument types are: (int, <error-type>)
            object type is: at::Tensor
      const int64_t batch = x.size(0), reduce = x.size(1, cols = x.size(2); cudaError_t e = cudaGetLastError();
                                                  ^
/t/include/ATen/core/TensorBody.h(3434): note #3322-D: number of parameters of function "at::Tensor::size(at::Dimname) const" does not match the call
  inline int64_t Tensor::size(at::Dimname dim) const {
                         ^

/b/cuda.cu(70): warning #12-D: parsing restarts here after previous syntax error
Remark: The warnings can be suppressed with "-diag-suppress <warning-number>"

3 errors detected in the compilation of "/b/cuda.cu".
ninja: build stopped: subcommand failed.
"""


def test_cuda_unit_errors_read_past_a_diagnostics_own_lines_and_stop_at_anothers():
    """The lines nvcc indents under a diagnostic (the source line, an overload's argument types) are the
    diagnostic's, and a warning of the unit is no error, whatever they say; a diagnostic of another file, or
    one more than EDG counted, is not."""
    assert kev.cuda_unit_errors(TIER_DUMP_211) == {67: [
        'identifier "cols" is undefined', 'expected a ")"',
        'no instance of overloaded function "at::Tensor::size" matches the argument list']}
    in_a_header = TIER_DUMP_211.replace("note #3322-D:", "error:").replace("3 errors", "4 errors")
    assert kev.cuda_unit_errors(in_a_header) is None
    assert kev.cuda_unit_errors(TIER_DUMP_211.replace("/b/cuda.cu(70): warning", "/b/zcuda.cu(70): warning")) is None
    assert kev.cuda_unit_errors(TIER_DUMP_211.replace("3 errors", "4 errors")) is None
    fatal = TIER_DUMP_211.replace("3 errors detected", "nvcc error   : 'cudafe++' died\n3 errors detected")
    assert kev.cuda_unit_errors(fatal) is None


def _unit(own: list, headers: str = "int declared_by_headers;\n") -> str:
    """A preprocessed unit: `headers` (another file), then the candidate's lines 4.. of cuda.cu."""
    return (f'# 1 "/usr/include/h.h"\n{headers}# 4 "cuda.cu"\n' + "\n".join(own) + "\n")


def test_split_preprocessed_keeps_the_candidates_lines_apart_from_the_headers():
    text = ('# 1 "cuda.cu"\n#include-free line 1\n# 1 "/h.h" 1\nint h;\n# 5 "cuda.cu" 2\nint a = 1;\n'
            '#pragma unroll\nint b;\n')
    own, rest = kev.split_preprocessed(text, "cuda.cu", {5: 2, 7: 4})
    assert own == [(2, "int"), (2, "a"), (2, "="), (2, "1"), (2, ";"), (4, "int"), (4, "b"), (4, ";")]
    assert "int h;" in rest and "int a" not in rest
    assert kev.split_preprocessed('# 5 "cuda.cu"\nauto s = R"(x)";\n', "cuda.cu", {5: 1}) is None


def _explain(errors: dict, lines: list, headers: str = "int declared_by_headers;\n", tier_lines=None,
             undeclared=frozenset()) -> str | None:
    where = {k + 3: k for k in range(1, len(lines) + 1)}
    own, rest = kev.split_preprocessed(_unit(lines, headers), "cuda.cu", where)
    tier_own = own if tier_lines is None else kev.split_preprocessed(_unit(tier_lines), "cuda.cu", where)[0]
    return kev.explained_errors(errors, own, tier_own, rest, undeclared)


def test_explained_errors_are_only_those_no_declaration_elsewhere_can_change():
    kernel = ["__global__ void k(float* y, int n) {",      # 1
              "    int i = threadIdx.x;",                   # 2
              "    int i = 0;",                             # 3
              "    y[i] = y_typo[i];",                      # 4
              "}"]                                          # 5
    undefined, redeclared = 'identifier "y_typo" is undefined', '"i" has already been declared in the current scope'
    assert _explain({4: [undefined]}, kernel) == "undefined"
    assert _explain({3: [redeclared]}, kernel) == "redeclared"
    assert _explain({3: [redeclared], 4: [undefined]}, kernel) == "redeclared+undefined"
    # undefined: the headers spell it (they may declare it), or the candidate spelled it before that use
    # (it may declare it): the build as written decides
    assert _explain({4: [undefined]}, kernel, headers="namespace at { int y_typo; }\n") is None
    assert _explain({4: [undefined]}, ["int y_typo;"] + kernel) is None
    assert _explain({5: [undefined]}, kernel) is None  # not where the candidate first spells it
    # nvcc's front end reports an undefined name once a scope: a later spelling in the reported use's block
    # (the same line, or a line it did not report) is explained; one outside that block may declare it
    assert _explain({4: [undefined]}, [line.replace("y_typo[i]", "y_typo[i] + y_typo[0]") for line in kernel]) \
        == "undefined"
    twice = kernel[:4] + ["    y[0] = y_typo[1];"] + kernel[4:]
    assert _explain({4: [undefined]}, twice) == "undefined"
    assert _explain({4: [undefined]}, twice[:5] + ["}", "int y_typo[2];"]) is None  # after the block: a global
    assert _explain({2: [undefined]}, ["struct S __attribute__((packed)) {"] + [  # a class body, not a block
        "    int a = y_typo[0];", "    int y_typo[2];", "};"]) is None
    # called, or launched: argument-dependent lookup finds declarations too, and nothing spells one
    assert _explain({4: [undefined]}, [line.replace("y_typo[i]", "y_typo(i)") for line in kernel]) == "undefined"
    launch = ["void launch(float* y) {", "    relu_kernel<<<1, 32>>>(y, 32);", "}"]
    relu = 'identifier "relu_kernel" is undefined'
    assert _explain({2: [relu]}, launch) == "undefined"
    assert _explain({2: [relu]}, launch, headers="__global__ void relu_kernel(float*, int);\n") is None
    # a dropped declaration: its uses in other blocks are reported too, and explained while the candidate
    # spells the name only on reported lines or after them in their blocks
    dropped = ["__global__ void k(float* y, int n) {",       # 1
               "    for (int i = 0; i < n; i += stride) {",  # 2
               "        y[i] = 0;",                          # 3
               "    }",                                      # 4
               "    for (int i = 0; i < n; i += stride) {",  # 5
               "        y[i] = 1;",                          # 6
               "    }",                                      # 7
               "}"]                                          # 8
    stride = 'identifier "stride" is undefined'
    assert _explain({2: [stride], 5: [stride]}, dropped) == "undefined"
    between = dropped[:3] + ["        int stride = 2; (void)stride;"] + dropped[3:]  # declared after the use, inside
    assert _explain({2: [stride], 6: [stride]}, between) == "undefined"
    before = ["__global__ void k(float* y, int n) {", "    { int stride = 2; (void)stride; }"] + dropped[1:]
    assert _explain({3: [stride], 6: [stride]}, before) is None  # declared before the first reported use
    assert _explain({5: [stride]}, dropped) is None  # the first spelling not reported: it may declare it
    # a copy confusion: a line pasted over the declaration of a name torch's headers also spell (at::Tensor's
    # stride()): no rule, unless a name probe found `stride` undeclared where the candidate looks it up; the
    # other conditions stand (a spelling not reported may declare it, any other error is the build's)
    pasted = dropped[:1] + ["    int start = 0;", "    int start = 0;"] + dropped[1:]
    start = '"start" has already been declared in the current scope'
    spelt = "namespace at { struct TensorBase { int stride(int) const; }; }\n"
    assert _explain({3: [start], 4: [stride], 7: [stride]}, pasted) == "redeclared+undefined"
    assert _explain({3: [start], 4: [stride], 7: [stride]}, pasted, headers=spelt) is None
    assert _explain({3: [start], 4: [stride], 7: [stride]}, pasted, headers=spelt,
                    undeclared=frozenset({"stride"})) == "redeclared+undefined"
    assert _explain({3: [start], 7: [stride]}, pasted, headers=spelt, undeclared=frozenset({"stride"})) is None
    assert _explain({3: [start], 4: [stride], 7: [stride], 8: ['expected a ";"']}, pasted, headers=spelt,
                    undeclared=frozenset({"stride"})) is None
    assert _explain({3: [start], 4: [stride], 7: [stride]}, pasted, headers=spelt,
                    undeclared=frozenset({"start"})) is None  # another name's answer says nothing of stride
    # found by review: the probe looks the name up at namespace scope; a call or template arguments
    # (argument-dependent lookup), a qualified definition (lookup in the scope it names) or a base class
    # (its members) may find it as written. Read on the tokens: a comment or a macro hides none of them
    probed = dict(headers=spelt, undeclared=frozenset({"stride"}))
    called = [line.replace("i += stride", "i += stride(y)") for line in pasted]
    assert _explain({3: [start], 4: [stride], 7: [stride]}, called, **probed) is None
    launched = [line.replace("i += stride)", "i += 1) stride<<<1, 1>>>(y)") for line in pasted]  # `<<<` lexes `<<` `<`
    assert _explain({3: [start], 4: [stride], 7: [stride]}, launched, **probed) is None
    for outside in (["int at::cuda::warp_size();"], ["struct B {};", "struct D : B {};"], ["void S::f();"],
                    ["int (at::cuda::warp_size)();"],  # a second review's: the declarator in parentheses
                    ["const float c10::x __attribute__((unused)) = 1.f;"],  # a third's: an attribute after it
                    ["struct B {};", "struct alignas(int{8}) D : B {};"]):  # and a brace in the class head
        assert _explain({3 + len(outside): [start], 4 + len(outside): [stride], 7 + len(outside): [stride]},
                        outside + pasted, **probed) is None, outside
    inside = ["int g() { return at::cuda::warp_size(); }"]  # a qualified call in a body: the same lookups
    assert _explain({4: [start], 5: [stride], 8: [stride]}, inside + pasted, **probed) == "redeclared+undefined"
    # a review's counterexample (it builds as written): a member function's body sees the class's friend
    # declared after it, through argument-dependent lookup on a class that cuda.h's cuInit selects
    friend = ["#include <type_traits>", "char cuInit(...);", "struct KevS {", "    void f() {",
              "        kev_n(std::conditional_t<sizeof(cuInit(0u)) == 4, KevS, int>());", "    }",
              "    friend void kev_n(KevS) {}", "};"]
    assert _explain({5: ['identifier "kev_n" is undefined']}, friend) is None
    # `c < n)` where lookup finds no c: nvcc reads c as a template's name (C++20) and expects a ">"; with no
    # `>` that could close it, that line reads as c used undefined, and the rule's other conditions stand
    angle = ["__global__ void k(float* y, int n) {", "    if (c < n) {", "        y[0] = c;", "    }", "}"]
    unclosed, c_undefined = 'expected a ">"', 'identifier "c" is undefined'
    assert _explain({2: [unclosed], 3: [c_undefined]}, angle) == "undefined"
    assert _explain({2: [unclosed]}, angle) == "undefined"   # the later use in its block: not reported
    for line in ("    if (c < n && n > 0) {", "    if (c < n && d < n) {", "    if (n < 2) {"):  # a `>` may close
        assert _explain({2: [unclosed], 3: [c_undefined]}, [angle[0], line] + angle[2:]) is None, line  # it; which name?
    assert _explain({2: [unclosed], 3: [c_undefined]}, angle, headers="int c;\n") is None  # the headers spell c
    assert _explain({2: [unclosed], 3: [c_undefined]}, angle, headers="int c;\n",
                    undeclared=frozenset({"c"})) == "undefined"   # unless a probe found it undeclared
    assert _explain({2: [unclosed], 3: [c_undefined]}, angle[:4] + ["    c<int>(y);", "}"], headers="int c;\n",
                    undeclared=frozenset({"c"})) is None   # template arguments (argument-dependent lookup)
    assert _explain({2: [unclosed], 3: [c_undefined]}, angle[:4] + ["    f(c < n > (y));", "}"], headers="int c;\n",
                    undeclared=frozenset({"c"})) is None   # `c<n>(y)` may call a template c
    # redeclared: only in a block, and only a declaration that cannot read as a function's (`i(a)`)
    assert _explain({2: ['"n" has already been declared in the current scope']},
                    ["namespace m {", "int n = 1;", "int n = 2;", "}"]) is None
    assert _explain({3: [redeclared]}, [line.replace("int i = 0;", "int i(0);") for line in kernel]) is None
    assert _explain({1: ['"i" has already been declared in the current scope']},
                    ["void f() { for (int i = 0; i < 2; ++i) { int i = 1; } }"]) == "redeclared"
    # a declaration only the headers add could hide a name the tier found, so that `N * x;` stops declaring:
    # no rule inside a namespace the candidate opens, nor with a class of its own that the headers name
    in_torch = ["namespace at {"] + kernel + ["}"]
    assert _explain({5: [undefined]}, in_torch) is None and _explain({4: [redeclared]}, in_torch) is None
    own_class = ["struct declared_by_headers {};"] + kernel
    assert _explain({4: [redeclared]}, own_class) is None
    assert _explain({4: [redeclared]}, ["struct own_type {};"] + kernel) == "redeclared"
    # nor where overload resolution (which the headers change) picks what a name means
    chosen = kernel[:3] + ["    S<decltype(f(y))>::m * y_typo;"] + kernel[4:]
    assert _explain({4: [undefined]}, chosen) is None
    aliased = ["using T = decltype(f(0));"] + kernel[:3] + ["    T::m * y_typo;"] + kernel[4:]
    assert _explain({5: [undefined]}, aliased) is None
    assert _explain({5: [undefined]}, [line.replace("using T = decltype(f(0));", "using T = S<int>;")
                                       for line in aliased]) is None
    # nor with a template of the candidate's, or a generic lambda (which instantiation keeps a branch depends
    # on types the headers choose)
    assert _explain({4: [redeclared]}, ["template <class T> struct own_type {};"] + kernel) is None
    assert _explain({4: [redeclared]}, ["auto own = [](auto v) { return v; };"] + kernel) is None
    assert _explain({4: [redeclared]}, ["struct own_type {};"] + kernel) == "redeclared"
    # found by a fifth review: a generic lambda spelt without `template` or `(auto`, whose `if constexpr`
    # branch one header set instantiates and the other discards (`requires { torch::complex(v, v); }`)
    generic = ["double f(double x, const float* y, int i) {", "    auto pick = [&](double v) {",
               "        if constexpr (sizeof(v) == 8) {", "            return qq_missing_fn(v) + qq_missing_fn(v);",
               "        } else { return v * 2.0 + (y[i] < 0); }", "    };", "    return pick(x);", "}"]
    qq = {4: ['identifier "qq_missing_fn" is undefined']}
    assert _explain(qq, generic) == "undefined"   # no template: a subscript before `<` is none either
    for head in ("[&](const auto& v) {", "[&]<typename T>(const T& v) {", "[&](std::floating_point auto v) {",
                 "[&](double v) requires true {"):
        assert _explain(qq, [generic[0], f"    auto pick = {head}"] + generic[2:]) is None, head
    assert _explain({5: qq[4]}, generic[:2] + ["        for (auto k : {1}) (void)k;"] + generic[2:]) is None  # alike
    # found by a third review: a base a trait or sizeof chooses (the member found through it a type in one
    # header set, a value in the other); a base of plain names is the same class under both
    chosen_base = ["struct D : std::conditional_t<sizeof(f(t)) == 1, A, B> {};"] + kernel[:3] + [
        "    D::m * y_typo;"] + kernel[4:]
    assert _explain({5: [undefined]}, chosen_base) is None
    assert _explain({5: [undefined]}, [line.replace("std::conditional_t<sizeof(f(t)) == 1, A, B>", "own_base")
                                       for line in chosen_base]) == "undefined"
    # found by a fourth review: an alias with an attribute, a specialization's base, and a name declared
    # earlier on the line of its use
    assert _explain({5: [undefined]}, ["using T [[]] = int;"] + kernel[:3] + ["    T::m * y_typo;"] + kernel[4:]) is None
    assert _explain({1: [undefined]}, ["template <> struct D<int> : S<sizeof(f(t))> { void g() { m * y_typo; } };"]
                    + kernel) is None
    assert _explain({4: [undefined]}, kernel[:3] + ["    { int y_typo; } y[i] = y_typo[i];"] + kernel[4:]) is None
    # any other error, or the candidate's tokens not the same under both header sets (a macro): no rule
    assert _explain({3: [redeclared], 4: ['expected a ";"']}, kernel) is None
    assert _explain({3: [redeclared]}, kernel, tier_lines=[kernel[0].replace("float", "MACRO")] + kernel[1:]) is None
    assert _explain({}, kernel) is None


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which("nvcc"), reason="needs nvcc")
def test_early_verdicts_read_the_unit_as_written_preprocessed_by_nvcc(tmp_path):
    """nvcc -E of the unit as written (torch/types.h first, as load_inline writes it) and of a tier's (here
    cuda_runtime.h alone), with a build.ninja's flags as torch writes them: each rule on a source it applies
    to, and no rule where a macro of torch's headers makes the candidate's tokens differ or the headers
    spell the undefined name."""
    import torch.utils.cpp_extension as ce
    flags = ["-std=c++17", "--expt-relaxed-constexpr", "-DTORCH_API_INCLUDE_EXTENSION_H"] + [
        f"-isystem {p}" for p in ce.include_paths()] + [f"-isystem {sysconfig.get_paths()['include']}"]
    (tmp_path / "build.ninja").write_text(f"nvcc = {shutil.which('nvcc')}\ncuda_cflags = {' '.join(flags)}\n"
                                          "cuda_post_cflags = \n")
    kernel = ("__global__ void k(float* y, int n) {\n    int i = threadIdx.x;\n    if (i < n) y[i] = 2.f * y[i];\n}\n")

    def verdict(source: str, errors: str, tier_header: str = "#include <cuda_runtime.h>\n",
                undeclared=frozenset(), details: str = "") -> str | None:
        args = {"cuda_sources": [source]}
        tier_args = {"cuda_sources": [tier_header, source], "build_directory": str(tmp_path)}
        first_line = tier_header.count("\n") + 2  # of the candidate's in the tier's unit: after its headers
        dump = "".join(f"/b/cuda.cu({line + first_line - 1}): error: {m}\n{details}" for line, m in errors)
        dump += f"{len(errors)} errors detected in the compilation of \"/b/cuda.cu\".\n"
        return kev.early_verdict(args, tier_args, dump, None, 120,  # as kernel_build calls it for the light tier
                                 dropped=(kb.FULL_HEADER, kb.TYPES_HEADER), expanded=None, undeclared=undeclared)

    assert verdict(kernel.replace("if (i < n)", "if (i < n"), [(3, 'expected a ")"')]) == "unbalanced"
    assert verdict(kernel.replace("y[i];", "y_typo[i];"), [(3, 'identifier "y_typo" is undefined')]) == "undefined"
    # the lines nvcc writes under a diagnostic may say "error" (an echoed cudaError_t, an argument of <error-type>)
    assert verdict(kernel.replace("y[i];", "y_typo[i];"), [(3, 'identifier "y_typo" is undefined')],
                   details="      if (i < n) y[i] = 2.f * y_typo[i]; // cudaError_t\n") == "undefined"
    assert verdict(kernel.replace("if (i < n)", "if (i < n"), [(3, 'expected a ")"')],
                   details="            argument types are: (int, <error-type>)\n") == "unbalanced"
    assert verdict(kernel.replace("    int i = threadIdx.x;\n", "    int i = threadIdx.x;\n    int i = 0;\n"),
                   [(3, '"i" has already been declared in the current scope')]) == "redeclared"
    # a line pasted over `stride`'s declaration: torch's headers spell stride (at::Tensor's), so only a name
    # probe's answer (kernel_build) lets the rules read it undefined
    strided = ("__global__ void k(float* y, int n) {\n    int start = threadIdx.x;\n    int start = threadIdx.x;\n"
               "    for (int i = start; i < n; i += stride) y[i] = 0.f;\n}\n")
    pasted = [(3, '"start" has already been declared in the current scope'), (4, 'identifier "stride" is undefined')]
    assert verdict(strided, pasted) is None
    assert verdict(strided, pasted, undeclared=frozenset({"stride"})) == "redeclared+undefined"
    # a declaration dropped, as nvcc (C++20, as torch builds) reports its uses: once a scope, and `c < n)`
    # read as template arguments no `>` closes
    dropped = ("__global__ void k(float* y, int n) {\n    if (kev_c < n) {\n        y[kev_c] = 0.f;\n    }\n"
               "    if (threadIdx.x == 0 && kev_c < n) y[kev_c] = 1.f;\n}\n")
    as_reported = [(2, 'expected a ">"'), (3, 'identifier "kev_c" is undefined'), (5, 'expected a ">"'),
                   (5, 'identifier "kev_c" is undefined')]
    assert verdict(dropped, as_reported) == "undefined"
    spelt = [(line, m.replace("kev_c", "c")) for line, m in as_reported]   # torch's headers spell c
    assert verdict(dropped.replace("kev_c", "c"), spelt) is None
    assert verdict(dropped.replace("kev_c", "c"), spelt, undeclared=frozenset({"c"})) == "undefined"
    # a second review's: a line splice, a comment or a macro between the name and its call hide the call
    # from the source's text, not from the preprocessed tokens the rules read
    for call in ("stride\\\n(n)", "stride /* c */ (n)"):
        spliced = strided.replace("i += stride)", f"i += {call})")
        assert verdict(spliced, pasted, undeclared=frozenset({"stride"})) is None, call
    macro = "#define KEV_CALL stride\n" + strided.replace("i += stride)", "i += KEV_CALL(n))")
    assert verdict(macro, [(4, pasted[0][1]), (5, pasted[1][1])], undeclared=frozenset({"stride"})) is None
    # torch's headers declare at::Tensor: a tier without them calls `Tensor` undefined, as written it is not
    with_tensor = "using namespace at;\n" + kernel.replace("int n)", "int n, Tensor* t)")
    assert verdict(with_tensor, [(2, 'identifier "Tensor" is undefined')]) is None
    # C10_HOST_DEVICE is torch's macro: the tier sees the name, the unit as written its expansion
    with_macro = kernel.replace("__global__ void k", "C10_HOST_DEVICE int i_macro = 1;\n__global__ void k")
    assert verdict(with_macro.replace("    int i = threadIdx.x;\n", "    int i = threadIdx.x;\n    int i = 0;\n"),
                   [(4, '"i" has already been declared in the current scope')]) is None
    # found by review: each fired before the rules looked for hiding and for sources that read their folder,
    # and each builds as written. torch's headers declare at::indexing::INDEX_MAX (a variable) and at::Context
    # (a class): inside those namespaces `N * x;` means another thing than under the tier's headers
    hidden = ("struct INDEX_MAX {};\nnamespace at { namespace indexing {\ninline void kev_fn() {\n"
              "    int kev_x = 0;\n    INDEX_MAX * kev_x;\n}\n}}\n" + kernel)
    assert verdict(hidden, [(5, '"kev_x" has already been declared in the current scope')]) is None
    context = "int Context = 2;\nnamespace at {\ninline void kev_fn() {\n    Context * kev_q;\n}\n}\n" + kernel
    assert verdict(context, [(4, 'identifier "kev_q" is undefined')]) is None
    # found by a second review: which specialization a name is read in depends on at::relu, which only the
    # headers as written declare (argument-dependent lookup): a type under one header set, a value under the other
    adl = ("struct KevY {};\ntemplate <typename T> struct KevSel { static const int x = 0; };\n"
           "template <> struct KevSel<at::Tensor> { typedef int x; };\n"
           "template <typename T> KevY relu(const T&);\nvoid kev_host(const at::Tensor& t) {\n"
           "    KevSel<decltype(relu(t))>::x * kev_q;\n}\n" + kernel)
    assert verdict(adl, [(6, 'identifier "kev_q" is undefined')]) is None
    trait = ("struct KuA { static const int Kum = 2; };\nstruct KuB { struct Kum {}; };\n"
             "struct KuD : std::conditional_t<std::is_invocable_v<std::plus<>, at::Tensor, at::Tensor>, KuB, KuA> {\n"
             "    void g() { Kum * kuy; } };\n" + kernel)  # a third review's: at::operator+ picks the base
    assert verdict(trait, [(4, 'identifier "kuy" is undefined')]) is None
    # a fifth review's: a global only the tier's headers declare (here a stand-in in the tier's header line)
    # hides the candidate's class there, so that the tier reads a product where the unit as written declares
    tier_global = ("struct kev_tier_only { int v; };\nint kev_f() {\n    kev_tier_only * kev_p;\n    return 0;\n}\n"
                   + kernel)
    assert verdict(tier_global, [(3, 'identifier "kev_p" is undefined')],
                   tier_header="#include <cuda_runtime.h>\nconstexpr int kev_tier_only = 1;\n") is None
    # a seventh review's: a macro's lone backslash, which cudafe++ reads again as a line splice, made `kev_`
    # and `n` one friend declared after the call, found as written by argument-dependent lookup on the
    # class cuda.h's cuInit selects; a macro's `#` is a line marker there
    spliced = ("#include <type_traits>\n#define BS \\/**/\n#define ID(x) x\nchar cuInit(...);\nstruct KevS {\n"
               "    void f() {\n        kev_n(std::conditional_t<sizeof(cuInit(0u)) == 4, KevS, int>());\n    }\n"
               "    friend void ID(kev_)BS\nn(KevS) {}\n};\n" + kernel)
    assert verdict(spliced, [(7, 'identifier "kev_n" is undefined')]) is None
    marker = '#define HASH #\nHASH 40 "cuda.cu"\n' + kernel.replace("y[i];", "y_typo[i];")
    assert verdict(marker, [(5, 'identifier "y_typo" is undefined')]) is None
    # a sixth review's: a conditional hidden from a directive check by a comment after its # (the host pass,
    # which no rule reads, held the redeclaration); a line splice after the # hides one the same way
    hidden_if = kernel.replace("y[i];", "y_typo[i];")
    for spelling in ("#/**/if 1\n#/**/endif\n", "#\\\nif 1\n#\\\nendif\n", "/*\n*/ #if 1\n/*\n*/ #endif\n"):
        assert verdict(spelling + hidden_if, [(3 + spelling.count("\n"), 'identifier "y_typo" is undefined')]) is None
    assert verdict(hidden_if, [(3, 'identifier "y_typo" is undefined')]) == "undefined"
    digraph = "%:line 40\n" + kernel.replace("y[i];", "y_typo[i];")  # %: is #: a source that renumbers its lines
    assert verdict(digraph, [(4, 'identifier "y_typo" is undefined')]) is None
    folder = kernel.replace("2.f * y[i];", '2.f * y[i]\n#if !__has_include("build.ninja")\n)\n#endif\n;')
    assert verdict(folder, [(6, 'expected a ")"')]) is None  # the real build's folder holds build.ninja
    # a source that renumbers its own lines (#line) or writes other tokens for the host pass: no rule
    assert verdict("#line 40\n" + kernel.replace("y[i];", "y_typo[i];"),
                   [(4, 'identifier "y_typo" is undefined')]) is None
    assert verdict("#ifdef __CUDA_ARCH__\n#endif\n" + kernel.replace("y[i];", "y_typo[i];"),
                   [(5, 'identifier "y_typo" is undefined')]) is None


@pytest.mark.gpu
def test_cuda_compile_errors_the_headers_cannot_rescue_cost_only_the_slim_build(tmp_path):
    """Through evaluate: a kernel whose brackets do not pair up, one that uses a name no header spells, and
    one that declares a variable twice in its body are compile errors after the slim tier's build alone
    (no probe, no build as written), with the tier's diagnostics; a kernel the slim tier cannot build but
    the headers as written can (Python's PyType_Type) is still built as written and correct."""
    benign = open(os.path.join(ADV, "cuda", "benign.py")).read()
    cache = str(tmp_path / "cache")

    def builds_of(extension: str) -> int:
        return sum(f'{extension}' in open(p).read().split("TORCH_EXTENSION_NAME=")[1].split()[0]
                   for p in glob.glob(os.path.join(cache, "**", "build", "*", "build.ninja"), recursive=True))
    broken = {
        "unbalanced": (benign.replace("    float v = in[i];", "    float v = (in[i];", 1), 'expected a ")"'),
        "undefined": (benign.replace("    float v = in[i];", "    float v = in[i] * kernel_eval_typo;", 1),
                      'identifier "kernel_eval_typo" is undefined'),
        "redeclared": (benign.replace("    float v = in[i];", "    float v = in[i];\n    float v = 0.f;", 1),
                       'has already been declared in the current scope'),
    }
    for rule, (source, diagnostic) in broken.items():
        assert source != benign
        result = kernel_eval.evaluate(REFERENCE, source.replace('name="ext"', f'name="ext_{rule}"'),
                                      device="cuda", cache_root=cache, gpu_trials=30)
        assert result.status == "compile_error" and diagnostic in result.message, (rule, result.message)
        assert result.early_verdict == rule   # the rule that judged it, as train.py's metrics keep it
        assert builds_of(f"ext_{rule}") == 1 and "compile.probe" not in result.seconds, (rule, result.seconds)
    assert not glob.glob(os.path.join(cache, "name_probes", "*", "*"))
    rescued = benign.replace("    auto xc = x.contiguous();", "    TORCH_CHECK(&PyType_Type != nullptr);\n"
                             "    auto xc = x.contiguous();", 1).replace('name="ext"', 'name="ext_rescued"')
    result = kernel_eval.evaluate(REFERENCE, rescued, device="cuda", cache_root=cache, gpu_trials=30)
    assert result.status == "correct" and builds_of("ext_rescued") == 2, result.message
    assert result.early_verdict == ""
