"""kernel_types: which values in a candidate's code are tensors, for the gate's rules (kernel_gate.py).

A flow-insensitive inference over the whole file. Each top-level function gets one environment (name ->
kind: TENSOR, SCALAR, EXT for the compiled extension, UNKNOWN, or "self"); forward roots' parameters are
tensors, a helper's parameters take the kinds its call sites hand it, `self.x` takes what is assigned to
it anywhere, the compiled extension's results are tensors. A few rounds reach the fixpoint; then each
node has one kind (Types.kind). A value it cannot place is UNKNOWN, which the gate lets through: a
determined attacker can launder a tensor past it, and the harness judges the result. Standard library
only; `c` is kernel_gate's parsed candidate (its nodes, definitions, aliases and allowed lists).
"""
from __future__ import annotations

import ast

TENSOR, SCALAR, EXT, UNKNOWN = "tensor", "scalar", "ext", "unknown"


def join(a: str | None, b: str) -> str:
    if a is None:
        return b
    for winner in (TENSOR, EXT, UNKNOWN):
        if winner in (a, b):
            return winner
    return SCALAR


class Types:
    """The kinds of one candidate's values (`c`: kernel_gate's parsed candidate), read through kind(node)."""

    def __init__(self, c):
        self.c = c
        self.roots = c.forward_scope[1]
        self.ext_names: set[str] = set()
        self.self_attrs: dict[str, str] = {}
        self.param_types: dict[tuple[str, str], str] = {}
        self.returns: dict[str, str] = {}
        self.cache: dict[ast.AST, str] | None = None  # on once the environments are final
        functions = [n for n in c.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
        self.outer = [f for f in functions if not c.enclosing_functions(f)]
        self.module_env: dict[str, str] = {}
        for _ in range(4):
            self.bind_all(c.tree, self.module_env, skip_functions=True)
            self.envs = {f: self.function_env(f) for f in self.outer}
        self.cache = {}

    # ----------------------------------------------------------------- reading the result
    def env(self, node: ast.AST) -> dict[str, str]:
        functions = self.c.enclosing_functions(node)
        return self.envs[functions[-1]] if functions else self.module_env

    def kind(self, node: ast.AST) -> str:
        known = self.cache.get(node)
        return known if known is not None else self.typ(node, self.env(node))

    def is_tensor(self, node: ast.AST) -> bool:
        return self.kind(node) == TENSOR

    def is_self(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and self.env(node).get(node.id) == "self"

    # ----------------------------------------------------------------- the inference
    def function_env(self, fn: ast.AST) -> dict[str, str]:
        env: dict[str, str] = {}
        for node in self.c.walk(fn):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                self.bind_params(node, env)
        self.bind_all(fn, env, skip_functions=False)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in self.c.walk(fn):
                if isinstance(node, ast.Return) and node.value is not None:
                    self.returns[fn.name] = join(self.returns.get(fn.name), self.typ(node.value, env))
        return env

    def bind_params(self, fn: ast.AST, env: dict[str, str]):
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        is_method = isinstance(self.c.parent.get(fn), ast.ClassDef)
        if is_method and args and not any(isinstance(d, ast.Name) and d.id == "staticmethod"
                                          for d in getattr(fn, "decorator_list", [])):
            env[args[0].arg] = "self"
            args = args[1:]
        root = fn in self.roots
        name = getattr(fn, "name", None)
        for i, a in enumerate(args):
            ann = a.annotation
            if isinstance(ann, ast.Name) and ann.id in ("int", "float", "bool", "str"):
                kind = SCALAR
            elif root:
                kind = TENSOR
            else:
                kind = self.param_types.get((name, str(i)), UNKNOWN)
                kind = join(kind, self.param_types.get((name, a.arg), kind))
            env[a.arg] = join(env.get(a.arg), kind) if env.get(a.arg) != "self" else "self"
        for a in (fn.args.vararg, fn.args.kwarg):
            if a is not None:
                env[a.arg] = TENSOR if root else UNKNOWN

    def bind_all(self, scope: ast.AST, env: dict[str, str], skip_functions: bool):
        nodes = self._walk_outside_functions(scope) if skip_functions else self.c.walk(scope)
        for node in nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                kind = self.typ(node.value, env)
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    self.bind_target(t, kind, env)
            elif isinstance(node, ast.AugAssign):
                self.bind_target(node.target, join(self.typ(node.target, env), self.typ(node.value, env)), env)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                self.bind_target(node.target, self.typ(node.iter, env), env)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                self.bind_target(node.optional_vars, UNKNOWN, env)
            elif isinstance(node, ast.Call):
                self.note_call_site(node, env)

    @staticmethod
    def _walk_outside_functions(root: ast.AST):
        stack = [root]
        while stack:
            node = stack.pop()
            yield node
            for child in ast.iter_child_nodes(node):
                if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    stack.append(child)

    def bind_target(self, target: ast.AST, kind: str, env: dict[str, str]):
        if isinstance(target, ast.Name):
            if kind == EXT:
                self.ext_names.add(target.id)
            env[target.id] = join(env.get(target.id), kind)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.bind_target(elt.value if isinstance(elt, ast.Starred) else elt, kind, env)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                env.get(target.value.id) == "self":
            self.self_attrs[target.attr] = join(self.self_attrs.get(target.attr), kind)

    def note_call_site(self, call: ast.Call, env: dict[str, str]):
        """Helpers handed a tensor treat that parameter as a tensor."""
        func = call.func
        name = func.id if isinstance(func, ast.Name) else (func.attr if isinstance(func, ast.Attribute) else None)
        if name not in self.c.defs or name == "register_buffer":
            return
        for i, a in enumerate(call.args):
            key = (name, str(i))
            self.param_types[key] = join(self.param_types.get(key), self.typ(a, env))
        for k in call.keywords:
            if k.arg:
                key = (name, k.arg)
                self.param_types[key] = join(self.param_types.get(key), self.typ(k.value, env))

    def typ(self, node: ast.AST, env: dict[str, str]) -> str:
        if self.cache is None:
            return self._typ(node, env)
        if node not in self.cache:
            self.cache[node] = self._typ(node, env)
        return self.cache[node]

    def _typ(self, node: ast.AST, env: dict[str, str]) -> str:
        path = self.c.dotted(node)
        if path is not None:
            return SCALAR if path.split(".")[0] != "torch" or path in self.c.allowed.torch else UNKNOWN
        if isinstance(node, (ast.Constant, ast.JoinedStr)):
            return SCALAR
        if isinstance(node, ast.Name):
            kind = env.get(node.id, self.module_env.get(node.id))
            if kind == "self":
                return UNKNOWN
            if kind != TENSOR and node.id in self.ext_names:
                return EXT
            return kind or UNKNOWN
        if isinstance(node, ast.Attribute):
            base = self.typ(node.value, env)
            if isinstance(node.value, ast.Name) and env.get(node.value.id) == "self":
                return self.self_attrs.get(node.attr, UNKNOWN)
            if base == TENSOR:
                return SCALAR if node.attr in self.c.allowed.scalar_attrs else TENSOR
            return base if base in (EXT, SCALAR) else UNKNOWN
        if isinstance(node, ast.Call):
            return self.call_type(node, env)
        if isinstance(node, (ast.BinOp, ast.BoolOp, ast.Compare, ast.UnaryOp)):
            parts = {ast.BinOp: lambda n: [n.left, n.right], ast.BoolOp: lambda n: n.values,
                     ast.Compare: lambda n: [n.left, *n.comparators],
                     ast.UnaryOp: lambda n: [n.operand]}[type(node)](node)
            kinds = [self.typ(p, env) for p in parts]
            return TENSOR if TENSOR in kinds else (SCALAR if all(k == SCALAR for k in kinds) else UNKNOWN)
        if isinstance(node, ast.IfExp):
            return join(self.typ(node.body, env), self.typ(node.orelse, env))
        if isinstance(node, ast.Subscript):
            base = self.typ(node.value, env)
            return base if base in (TENSOR, SCALAR) else UNKNOWN
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            kinds = [self.typ(e, env) for e in node.elts]
            return TENSOR if TENSOR in kinds else (SCALAR if all(k == SCALAR for k in kinds) else UNKNOWN)
        if isinstance(node, ast.Dict):
            kinds = [self.typ(v, env) for v in node.values]
            return TENSOR if TENSOR in kinds else UNKNOWN
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return TENSOR if self.typ(node.elt, env) == TENSOR else UNKNOWN
        if isinstance(node, (ast.Starred, ast.NamedExpr)):
            return self.typ(node.value, env)
        return UNKNOWN

    def call_type(self, node: ast.Call, env: dict[str, str]) -> str:
        path = self.c.dotted(node.func)
        if path == "torch.utils.cpp_extension.load_inline":
            return EXT
        if path is not None:
            if path.split(".")[0] != "torch" or path in ("torch.Size", "torch.device", "torch.get_default_dtype") \
                    or path.startswith("torch.cuda."):
                return SCALAR
            return TENSOR
        arg_kinds = [self.typ(a, env) for a in [*node.args, *(k.value for k in node.keywords)]]
        if isinstance(node.func, ast.Attribute):
            receiver = self.typ(node.func.value, env)
            if receiver == EXT:
                return TENSOR
            if receiver == TENSOR:
                return SCALAR if node.func.attr in self.c.allowed.scalar_methods else TENSOR
            if isinstance(node.func.value, ast.Name) and env.get(node.func.value.id) == "self":
                kind = self.returns.get(node.func.attr, UNKNOWN)
                return TENSOR if TENSOR in arg_kinds else kind
        if TENSOR in arg_kinds:
            return TENSOR
        if isinstance(node.func, ast.Name):
            if node.func.id in self.c.defs:
                return self.returns.get(node.func.id, UNKNOWN)
            if node.func.id in ("len", "int", "float", "bool", "range", "min", "max", "abs",
                                "round", "divmod", "pow", "sum", "str", "tuple"):
                return SCALAR if all(k == SCALAR for k in arg_kinds) else UNKNOWN
            if node.func.id in self.ext_names:
                return TENSOR
        return UNKNOWN
