"""kernel_early_verdict: when a CUDA source's failure on a header tier is its verdict, for kernel_build.

A tier's failure the headers as written cannot rescue is the verdict at once: the build as written is
read preprocessed (nvcc -E: its first device pass, a second or two) instead of compiled (cudafe++
parsing all of torch's headers, 10-15 s). Preprocessing expands every macro, so the candidate's own
lines, preprocessed under the tier's headers and under the headers as written, hold the same tokens
unless a macro or a conditional of theirs differs (then only "unbalanced" may apply).

Rules (early_verdict)
- "unbalanced": the unit's (), [] or {} do not pair up (counted over the whole preprocessed unit, string
  and character literals and directive lines aside): no C++ grammar parses that, whatever is declared.
- "undefined": an identifier the tier called undefined that no token of the headers as written spells
  (or that kernel_build's name probe found undeclared at namespace scope as written, where the candidate's
  tokens look it up nowhere else: never called or given template arguments, no qualified declarator
  outside a block, no base class), and that the candidate spells only where the tier reported it undefined
  (the first spelling on such a line), or after such a spelling in the block that holds it, where nvcc's front
  end reports it no more (spellings_explained): nothing in the unit declares it where a reported use could
  find it, so every such lookup fails as written too, called or not (a dropped declaration leaves each use of
  its name an error). A declaration of the candidate's elsewhere could be found there (a member function's
  body sees its whole class, argument-dependent lookup its friends, in a class that overload resolution,
  which the headers change, may choose). `expected a ">"` on a line whose only name before a `<` no `>` can
  close reads as that name used undefined: before `<`, a name lookup finds nowhere names a template
  (C++20), under both header sets alike.
- "redeclared": a name the tier found declared twice in one block (a function's or statement's body),
  the second time with `=`, `;`, `[`, `{` or `,` after it: the two declarations are the candidate's
  tokens in the candidate's braces, and no declaration elsewhere can make either stop being one without
  an error of its own (a name that stops naming a type leaves `T x` ill-formed).

"undefined" and "redeclared" need every one of the tier's .cu errors explained (explained_errors), so
the tier's diagnostics, the verdict's message, say nothing the build as written would not. They also need:
- no declaration only the headers as written add may hide a name the tier found, which could turn
  `N * x;` from a declaration into a product: no namespace the candidate opens, no class of its own that
  either header set names;
- overload resolution may not decide what a name means (`S<decltype(f(t))>::m`): no `::` after `>` or
  `)`; no decltype, typedef or using, through which `T::m` could read a type chosen so; no class head
  with a base clause and a template-id, through which a member could be found in a base chosen so;
- no template of the candidate's (makes_a_template: nor a parameter declared auto, a generic lambda's, nor a
  lambda's template head, a requires-clause or a concept): an instantiation, which such types choose, may
  discard or keep what the tier reported (`if constexpr (requires { torch::complex(v, v); })`, a class
  template under the tier's headers and a function as written: a review's).

Limits
- What is read is the first device pass: a source that may read otherwise gets no rule (_NOT_READ_EARLY,
  any directive but #include <...>, #define, #undef and #pragma, and a `#` or a backslash its macros leave
  in the preprocessed unit, which cudafe++ would read again as a directive or a line splice).
- What the rules cannot see: a macro of torch's headers that gives the candidate's line other tokens in
  the host pass, or a class of the tier's headers that a global of the other headers hides. A global of
  the candidate's that clashes with a declaration only the headers as written hold (`int cuInit;` where
  the tier lacks cuda.h) is one more error as written, which the verdict's message leaves out. Only a
  source written for it would meet one, and an early verdict is a compile error: it would cost that
  source alone.

kernel_build calls early_verdict once a CUDA source failed on its last header tier
(BuildConfig.early_verdicts) and says how that tier rewrote the candidate's lines; this module imports
nothing of kernel_build. What kernel_build's name probes read too lives here: a failed build's cuda.cu
errors (cuda_unit_errors), the lines load_inline writes first in a .cu unit (AS_WRITTEN_CUDA_PREFIX)
and a load_inline call's sources (inline_sources).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
import shlex
import subprocess

from kernel_sandbox import atomic_write

# Shared with kernel_build's name probes, which import them from here (nothing here imports kernel_build):
# what load_inline writes first in a .cu unit as written, and how a failed build's cuda.cu errors read
AS_WRITTEN_CUDA_PREFIX = "#include <torch/types.h>\n#include <cuda.h>\n#include <cuda_runtime.h>\n"
_CUDA_UNIT_LINE = r"(?:^|[/\s(])cuda\.cu\W{1,3}(\d+)\W{1,3} ?"   # `/b/cuda.cu(13): `, `(cuda.cu:13): `
_CUDA_UNIT_ERROR = re.compile(_CUDA_UNIT_LINE + r"error: (.*?)\s*$")
_CUDA_UNIT_WARNING = re.compile(_CUDA_UNIT_LINE + r"warning\b")
UNDEFINED = re.compile(r'identifier "(\w+)" is undefined')
_ERRORS_DETECTED = re.compile(r"^(\d+) errors? detected in the compilation of ")


def cuda_unit_errors(build_error: str) -> dict | None:
    """{line: [messages]}: the errors a failed CUDA build reports in its cuda.cu unit, when those are all
    of its errors (EDG's count agrees, no other unit failed); None when anything else may have failed."""
    errors, counted, failed = {}, 0, []
    for raw in build_error.splitlines():
        line = raw.strip()
        if match := _CUDA_UNIT_ERROR.search(line):
            errors.setdefault(int(match.group(1)), []).append(match.group(2))
        elif match := _ERRORS_DETECTED.match(line):
            counted += int(match.group(1))
        elif line.startswith("FAILED:"):
            failed.append(line)
        elif raw[:1] in (" ", "\t") or _CUDA_UNIT_WARNING.search(line):
            # a diagnostic's own lines: the source line it echoes (`cudaError_t e = ...`) and its details
            # (`argument types are: (int, <error-type>)`), where a diagnostic's first line starts at column 0;
            # and the unit's warnings ("parsing restarts here after previous syntax error")
            continue
        elif (re.search(r"error|Error", line) and not line.startswith(("[", "Error building extension"))
              and not (" -c " in line and " -o " in line)):  # a command ninja echoes (paths may say "error")
            return None  # another diagnostic
    if not errors or counted != sum(map(len, errors.values())) or any("cuda.cuda.o" not in f for f in failed):
        return None
    return errors


def inline_sources(call: dict, key: str) -> list:
    """A load_inline call's `key` ("cuda_sources", "cpp_sources") as a list: load_inline takes a string or a list."""
    value = call.get(key) or []
    return [value] if isinstance(value, str) else list(value)


AS_WRITTEN_LINES = AS_WRITTEN_CUDA_PREFIX.rstrip("\n").split("\n")  # load_inline's first lines of a .cu unit
_LINE_MARKER = re.compile(r'#\s*(?:line\s+)?(\d+)\s+"((?:\\.|[^"\\])*)"')
_LITERAL_OR_NAME = re.compile(r'(?:u8|[uUL])?R"([^()\\\s]{0,16})\((?:.|\n)*?\)\1"|[A-Za-z_]\w*'
                              r'|(?:u8|[uUL])?"(?:\\.|[^"\\\n])*"|\.?\d(?:[eEpP][+-]|[\'\w.])*'
                              r"|(?:u8|[uUL])?'(?:\\.|[^'\\\n])*'|^[ \t]*#[^\n]*", re.M)
_TOKEN = re.compile(r'(?:u8|[uUL])?"(?:\\.|[^"\\\n])*"|(?:u8|[uUL])?\'(?:\\.|[^\'\\\n])*\'|[A-Za-z_]\w*'
                    r"|\.?\d(?:[eEpP][+-]|['\w.])*|::|->|\+\+|--|<<=?|>>=?|&&|\|\||[<>=!+\-*/%&|^]=|\S")
_DIGRAPH = re.compile(r"<:(?!:(?![:>]))|:>|<%|%>")
REDECLARED = re.compile(r'"(\w+)" has already been declared in the current scope')
UNCLOSED_TEMPLATE_ARGUMENTS = 'expected a ">"'
_NAME = re.compile(r"[A-Za-z_]\w*")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
# sources no rule reads: a directive but #include <...>, #define, #undef and #pragma (a conditional may give
# the host pass, unread, other tokens; #line renumbers; a quoted include reads the folder, which is another
# one here), or any written so that this check cannot see it (a comment or a line splice after the #);
# __has_include (reads the folder), __FILE__, token pasting, __CUDA_ARCH__, digraphs
_NOT_READ_EARLY = re.compile(r"__has_include|__FILE__|__CUDA_ARCH|##|%:|" + _DIGRAPH.pattern
                             + r"|\*/[ \t]*#")  # a directive after a comment that ends its line's start
_DIRECTIVE = re.compile(r"^[ \t]*#(.*)$", re.M)
_PLAIN_DIRECTIVE = re.compile(r"[ \t]*(?:include[ \t]*<|define[ \t]|undef[ \t]|pragma[ \t])")  # the only ones read
# through these a name may stand for a type taken from an expression (then from overload resolution), or for
# another name: no rule reads past them
_TYPE_OF_AN_EXPRESSION = frozenset({"decltype", "typeof", "__typeof__", "__typeof", "typedef", "using"})
_TEMPLATE_WORDS = frozenset({"template", "requires", "concept"})
# words after which `[` opens a lambda, not a subscript
_BEFORE_AN_EXPRESSION = frozenset({"return", "co_return", "co_yield", "co_await", "throw", "case", "else", "do",
                                   "sizeof", "new", "delete", "and", "or", "not"})
_BLOCK_AFTER = frozenset({")", ";", "{", "}", "else", "do", "try"})  # what precedes a block's "{"
# what may follow a qualified declarator-id (`int ns::x __attribute__((unused)) = ...`: a third review's);
# a reserved identifier (__attribute__, __asm__, __declspec) is refused too
_AFTER_A_DECLARATOR_ID = frozenset({"(", ")", "=", ";", "{", "[", ",", "asm", "alignas", ":"})


def rules_may_read(message: str) -> bool:
    """Whether a tier's .cu error is one the "undefined" and "redeclared" rules read (explained_errors)."""
    return bool(UNDEFINED.fullmatch(message) or REDECLARED.fullmatch(message)) or message == UNCLOSED_TEMPLATE_ARGUMENTS


def preprocess_cuda_unit(build_directory: str, text: str, drop_include: str | None, timeout_s: float) -> str | None:
    """`text` as a .cu unit preprocessed by the command the tier's build ran (its build.ninja: nvcc, cuda
    flags), less the include path `drop_include` (the tier's lean op headers); None when that fails."""
    flags = {}
    try:
        with open(os.path.join(build_directory, "build.ninja")) as f:
            for line in f:
                key, _, value = line.partition(" = ")
                if key in ("nvcc", "cuda_cflags", "cuda_post_cflags"):
                    flags[key] = value.strip()
    except OSError:
        return None
    if "nvcc" not in flags or "$" in "".join(flags.values()):  # ninja's escapes: not worth reading
        return None
    command = shlex.split(flags["nvcc"]) + [a for a in shlex.split(flags.get("cuda_cflags", ""))
                                           + shlex.split(flags.get("cuda_post_cflags", ""))
                                           if a != f"-I{drop_include}"]
    # a folder of its own, named cuda.cu and given by that name: __FILE__ reads alike in every unit
    folder = os.path.join(build_directory, "early", hashlib.sha256(text.encode()).hexdigest()[:16])
    os.makedirs(folder, exist_ok=True)
    atomic_write(os.path.join(folder, "cuda.cu"), text)
    try:  # to stdout: a unit preprocessed writes no object file for ninja or a log to count
        done = subprocess.run(command + ["-E", "cuda.cu"], cwd=folder, capture_output=True, text=True,
                              errors="replace", timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def split_preprocessed(text: str, unit: str, own_lines: dict) -> tuple[list, str] | None:
    """(the candidate's tokens as [(its line, token)], the rest of the unit's text) of a preprocessed unit:
    a token is the candidate's when its line marker names `unit` at a line of `own_lines` ({unit's line:
    the candidate's line}); None for a raw string literal in those lines (one may span lines)."""
    own, rest, where, line = [], [], None, 0
    for content in text.split("\n"):
        if content.startswith("#"):
            if match := _LINE_MARKER.match(content):
                where, line = match.group(2), int(match.group(1))
                continue
            line += 1  # a #pragma: kept, not the grammar's tokens
            continue
        mine = own_lines.get(line) if where == unit else None
        if mine is None:
            rest.append(content)
        elif 'R"' in content:
            return None
        else:
            own.extend((mine, token) for token in tokens_of(content))
        line += 1
    return own, "\n".join(rest)


def brackets_unbalanced(text: str) -> str | None:
    """How a preprocessed unit's brackets fail to pair up ("1 more '(' than ')'"), outside literals and
    directive lines; None when they pair up, or a digraph (<: for [) or a quote outside any literal the
    lexer read makes the count unsure."""
    code = _LITERAL_OR_NAME.sub(" ", text)
    if _DIGRAPH.search(code) or '"' in code or "'" in code:  # a literal the lexer did not read
        return None
    for opening, closing in ("()", "[]", "{}"):
        more = code.count(opening) - code.count(closing)
        if more:
            return f"{abs(more)} more '{opening if more > 0 else closing}' than '{closing if more > 0 else opening}'"
    return None


def innermost_open_brace(tokens: list, at: int) -> int | None:
    """The index of the innermost "{" still open at token `at` of the candidate's [(line, token)], or None."""
    opened = []
    for k, (_, token) in enumerate(tokens[:at]):
        if token == "{":
            opened.append(k)
        elif token == "}" and opened:
            opened.pop()
    return opened[-1] if opened else None


def in_a_block(tokens: list, at: int) -> bool:
    """Whether token `at` of the candidate's [(line, token)] stands in a block: its innermost open "{"
    follows ")", ";", "{", "}", else, do or try (a body, or a brace no namespace scope accepts)."""
    opened = innermost_open_brace(tokens, at)
    return bool(opened) and tokens[opened - 1][1] in _BLOCK_AFTER


def makes_a_template(tokens: list) -> bool:
    """Whether a token list declares a template, spelt `template` or not: `auto` in parentheses (a generic
    lambda's or an abbreviated function template's parameter, `const auto&`, `Concept auto`; a `for (auto`
    or `if (auto` is refused alike), a lambda's template head (`[]<typename T>`: a `]` and `<` whose `[`
    follows no name, `)` or `]`, as a subscript's does), a requires-clause or a concept."""
    if _TEMPLATE_WORDS.intersection(tokens):
        return True
    opened = []
    for k, token in enumerate(tokens):
        if token in ("(", "[", "{"):
            opened.append(k)
        elif token in (")", "]", "}") and opened:
            start = opened.pop()
            if token == "]" and k + 1 < len(tokens) and tokens[k + 1] == "<" and not (start and (
                    tokens[start - 1] in (")", "]") or (_NAME.fullmatch(tokens[start - 1])
                                                        and tokens[start - 1] not in _BEFORE_AN_EXPRESSION))):
                return True
        elif token == "auto" and opened and tokens[opened[-1]] == "(":
            return True
    return False


def may_open_template_arguments(tokens: list, at: int) -> bool:
    """Whether the `<` at `at` of a token list may open template arguments: a `>` closes it before a `;` or
    the bracket around it closes (`c < (a > b) ? x : y)` cannot; `c < n && d > e` may)."""
    depth = 0
    for token in tokens[at + 1:]:
        if depth == 0 and token in (">", ">>", ">=", ">>="):
            return True
        if token in ("(", "[", "{"):
            depth += 1
        elif token in (")", "]", "}"):
            if depth == 0:
                return False
            depth -= 1
        elif depth == 0 and token == ";":
            return False
    return False


def spells(text: str, name: str) -> bool:
    """Whether `text` holds `name` as a word. The substring test first: a regex scan of the ~35 MB of both
    units' headers takes ~0.5 s a name, and most names an early verdict asks about are in none of them."""
    return name in text and re.search(rf"\b{re.escape(name)}\b", text) is not None


def tokens_of(code: str) -> list:
    """The C++ tokens of `code` as the rules read them (a string or character literal is one token)."""
    return _TOKEN.findall(code)


def called_or_given_template_arguments(tokens: list, name: str) -> bool:
    """Whether `name` stands in a token list where argument-dependent lookup may find it: before "(" or "<<"
    (a call; a kernel launch, `<<<` lexed "<<" "<"), or before a "<" that may open template arguments."""
    return any(token == name and k + 1 < len(tokens) and (tokens[k + 1] in ("(", "<<") or (
        tokens[k + 1] == "<" and may_open_template_arguments(tokens, k + 1))) for k, token in enumerate(tokens))


def block_after(tokens: list, at: int) -> int | None:
    """The index of the "}" that closes the block (in_a_block's) holding token `at` of the candidate's
    [(line, token)] (len(tokens) if it stays open); None when its innermost "{" opens no block, or may open
    a class body (`struct S __attribute__((packed)) {`: a class keyword before it at bracket depth 0)."""
    if not in_a_block(tokens, at):
        return None
    opened, depth = innermost_open_brace(tokens, at), 0
    for k in range(opened - 1, -1, -1):  # back to the statement's start: a class head?
        token = tokens[k][1]
        depth += (token in (")", "]")) - (token in ("(", "["))
        if depth == 0 and token in (";", "{", "}"):
            break
        if depth == 0 and token in ("struct", "class", "union"):
            return None
    depth = 0
    for k in range(opened, len(tokens)):
        depth += (tokens[k][1] == "{") - (tokens[k][1] == "}")
        if depth == 0:
            return k
    return len(tokens)


def spellings_explained(own: list, name: str, reported: set) -> bool:
    """Whether each of the candidate's spellings of an undefined `name` is one the tier reported (the first
    on a line it reported `name` undefined at) or follows one inside the block that holds it: nvcc's front end
    reports an undefined name once a scope (the name then counts as declared there, so that one dropped
    declaration is not an error at every use). A spelling in that block after the reported use may declare
    the name only there, after it: no lookup of a reported use finds it, in either header set. Any other
    spelling may declare it where a reported use finds it (a member function's body sees its whole class,
    argument-dependent lookup its friends, in a class that overload resolution, which the headers change,
    may choose)."""
    blocks, first_on = [], set()   # [(a reported spelling, the end of its block)], the lines read
    for k, (line, token) in enumerate(own):
        if token != name or any(start < k < end for start, end in blocks):
            continue
        if line not in reported or line in first_on:
            return False
        first_on.add(line)
        end = block_after(own, k)
        if end is not None:
            blocks.append((k, end))
    return True


def class_heads(tokens: list) -> list:
    """Each class head in `tokens`: from struct, class or union to its "{" or ";" (its name, template
    arguments, attributes and base clause)."""
    heads = []
    for k, token in enumerate(tokens):
        if token in ("struct", "class", "union"):
            end, depth = k + 1, 0  # a brace inside parentheses (alignas(int{8})) is no class body's
            while end < len(tokens):
                if depth == 0 and tokens[end] in ("{", ";", ")", "]"):  # ")": an enclosing one (`f(struct S* p)`)
                    break
                depth += (tokens[end] in ("(", "[")) - (tokens[end] in (")", "]"))
                end += 1
            heads.append(tokens[k + 1:end])
    return heads


def explained_errors(errors: dict, own: list, tier_own: list, headers: str,
                     undeclared: frozenset = frozenset()) -> str | None:
    """"undefined", "redeclared" or "redeclared+undefined" when every error of the tier's .cu unit
    ({the candidate's line: [messages]}) is one of those rules' (above), the candidate's tokens the same
    under both header sets (`own`, `tier_own`; `headers`: the rest of both units, the headers' text); else None.
    `undeclared`: names a name probe found undeclared where the candidate looks them up (kernel_build: no
    declaration of the headers as written, no macro), which headers may spell and still be undefined."""
    if not errors or own != tier_own:
        return None
    # a declaration only one header set has can change how the candidate's tokens parse (`N * x;` a
    # declaration or a product) by hiding the name the tier found: inside a namespace the candidate opens
    # (torch's own, or std), or where a header's variable or function hides a class of the candidate's.
    # So can overload resolution, which the headers as written change (torch's functions and tensor
    # operators, found by argument-dependent lookup), where it picks what a name means:
    # `S<decltype(f(t))>::m * x;` reads m in the specialization f's return type selects.
    tokens = [token for _, token in own]
    if ("namespace" in tokens or makes_a_template(tokens) or _TYPE_OF_AN_EXPRESSION.intersection(tokens) or any(
            token == "::" and k and tokens[k - 1] in (">", ">>", ")") for k, token in enumerate(tokens))
            or any(":" in head and "<" in head for head in class_heads(tokens)) or any(
            tokens[k] in ("struct", "class", "union", "enum") and k + 1 < len(tokens)
            and spells(headers, tokens[k + 1]) for k in range(len(tokens)))):
        return None
    # a name taken on a probe's word (`undeclared`) was looked up at namespace scope only: not where a call
    # or template arguments (argument-dependent lookup), a qualified definition (the scope it names) or a
    # base class (its members) could find it as written; read here on the tokens (comments, macros expanded)
    probe_holds = bool(undeclared) and not any(token == "::" and k + 2 < len(tokens) and not in_a_block(own, k) and (
        tokens[k + 1] in ("~", "operator") or tokens[k + 2] in _AFTER_A_DECLARATOR_ID
        or tokens[k + 2].startswith("__")) for k, token in enumerate(tokens)
    ) and not any(":" in head for head in class_heads(tokens))
    reported, rules = {}, set()   # {an undefined name: the lines the tier reported it at}, the rules read
    for line, messages in errors.items():
        for message in messages:
            if match := UNDEFINED.fullmatch(message):
                reported.setdefault(match.group(1), set()).add(line)
            elif message == UNCLOSED_TEMPLATE_ARGUMENTS:
                # `c < cols)` where lookup finds no c: a name followed by `<` names a template then (C++20), and
                # no `>` closes its arguments. Read as c undefined on that line, when c is the line's only such name
                names = {token for k, (where, token) in enumerate(own) if where == line and k + 1 < len(own)
                         and own[k + 1][1] == "<" and _NAME.fullmatch(token)
                         and not may_open_template_arguments(tokens, k + 1)}
                if len(names) != 1:
                    return None
                reported.setdefault(names.pop(), set()).add(line)
            elif match := REDECLARED.fullmatch(message):
                name = match.group(1)
                if not any(token == name and where == line and k + 1 < len(own)
                           and own[k + 1][1] in ("=", ";", "[", "{", ",") and in_a_block(own, k)
                           for k, (where, token) in enumerate(own)):
                    return None
                rules.add("redeclared")
            else:
                return None
    for name, lines in reported.items():
        spelt_by_headers = spells(headers, name)
        if spelt_by_headers and (name not in undeclared or not probe_holds
                                 or called_or_given_template_arguments(tokens, name)):
            return None
        if not lines <= {where for where, token in own if token == name} or not spellings_explained(own, name, lines):
            return None
        rules.add("undefined")
    return "+".join(sorted(rules))


def early_verdict(args: dict, tier_args: dict, tier_error: str, lean_ops_dir: str | None, timeout_s: float,
                  *, dropped: tuple, expanded: tuple | None, undeclared: frozenset = frozenset()) -> str | None:
    """The rule (above) by which a CUDA source that failed on a header tier fails as written too, or None.
    `args`: the load_inline call as written; `tier_args`: the tier's (its build directory holds its
    build.ninja); `lean_ops_dir`: an include path of the tier's own, left out of the unit as written's
    preprocessing. How the tier rewrote each of the candidate's lines (kernel_build's header_tier_args):
    the headers it `dropped`, then the one it `expanded` into text of its own ((header, text), or None).
    `undeclared`: names a name probe answered (explained_errors)."""
    errors = cuda_unit_errors(tier_error or "")
    build_directory = tier_args.get("build_directory")
    if errors is None or not build_directory:
        return None
    written, tier_sources = inline_sources(args, "cuda_sources"), inline_sources(tier_args, "cuda_sources")
    source = "\n".join(written)
    if (not tier_sources or _NOT_READ_EARLY.search(source)
            or any(not _PLAIN_DIRECTIVE.match(d.group(1)) for d in _DIRECTIVE.finditer(source))):
        return None
    explainable = all(rules_may_read(m) for ms in errors.values() for m in ms)
    if not explainable and not brackets_unbalanced(_COMMENT.sub(" ", source)):
        return None  # no rule could apply (the source's own brackets pair up): spare the preprocessor runs
    # the candidate's line k: line k + 3 of the unit as written; of the tier's, after its headers, each line
    # as header_tier_args rewrote it (a line that became several is the tier's, not the candidate's). The
    # tier's unit is preprocessed numbered as the unit as written (#line), so that __LINE__ reads alike.
    first = len(AS_WRITTEN_LINES)
    written_lines = {k + first: k for k in range(1, source.count("\n") + 2)}
    tier_lines, at = {}, tier_sources[0].count("\n") + 2
    renumbered = ['#line 1 "tier"', tier_sources[0], f'#line {first + 1} "cuda.cu"']
    for k, text in enumerate(source.split("\n"), start=1):
        for header in dropped:
            text = text.replace(header, "")
        if expanded and expanded[0] in text:
            head, _, tail = text.partition(expanded[0])
            text = head + expanded[1] + tail
            renumbered.append(f'{head}\n#line 1 "tier"\n{expanded[1]}#line {k + first} "cuda.cu"\n{tail}')
        else:
            renumbered.append(text)
        if "\n" not in text:
            tier_lines[at] = k
        at += text.count("\n") + 1
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        as_written = pool.submit(preprocess_cuda_unit, build_directory, "\n".join(AS_WRITTEN_LINES + written),
                                 lean_ops_dir, timeout_s)
        in_tier = pool.submit(preprocess_cuda_unit, build_directory, "\n".join(renumbered), None, timeout_s)
        as_written, in_tier = as_written.result(), in_tier.result()
    if as_written is None:
        return None
    split_full = split_preprocessed(as_written, "cuda.cu", written_lines)
    # cudafe++ lexes the preprocessed unit again: a `#` a macro of the candidate's wrote may be a directive
    # there (a line marker), a `\` a line splice that joins two of the tokens read here into one name; a raw
    # string (split_full None) leaves its lines unread, so either could hide there
    if split_full is None or any(token in ("#", "\\") for _, token in split_full[0]):
        return None
    split_tier = split_preprocessed(in_tier, "cuda.cu", written_lines) if in_tier else None
    if split_tier and all(line in tier_lines for line in errors):
        own_errors = {}
        for line, messages in errors.items():
            own_errors.setdefault(tier_lines[line], []).extend(messages)
        # the headers of both sets: a global of either may hide a class of the candidate's
        rule = explained_errors(own_errors, split_full[0], split_tier[0], split_full[1] + "\n" + split_tier[1],
                                undeclared)
        if rule:
            return rule
    return "unbalanced" if brackets_unbalanced(as_written) else None

