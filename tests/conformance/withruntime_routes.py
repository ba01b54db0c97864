"""The Runtime API routes the installed withruntime SDK can call, read from
its source (Python's ast, nothing imported or run).

Every call of the form ``<transport>.<fn>("METHOD", path, ...)`` is a
request; its path is rendered as a template where what the SDK fills in at
run time is ``{}``. Paths are built from literals, f-strings, ``+``, local
variables assigned once in the function, and the classes' own path helpers
(``_path``, ``_one``, ``_base``: a method that returns a path built from
its arguments). A call whose path cannot be rendered so is reported as
unresolved, never skipped.

    python3 tests/conformance/withruntime_routes.py --write

rewrites internal/api/testdata/withruntime_routes.txt, which the Go test
TestEveryWithruntimeRouteIsKnown walks; test_sdk_routes.py checks that
list against the installed SDK.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"}
REPO_ROOT = Path(__file__).resolve().parents[2]
LIST = REPO_ROOT / "internal" / "api" / "testdata" / "withruntime_routes.txt"


class Unresolved(Exception):
    pass


class _Classes:
    """The package's classes by name, for helpers and attributes a class
    inherits, and every constant a class attribute is given anywhere."""

    def __init__(self, trees: list[ast.Module]):
        self.by_name: dict[str, ast.ClassDef] = {}
        self.constants: dict[str, set[str]] = {}
        for tree in trees:
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    self.by_name.setdefault(node.name, node)
                    for stmt in node.body:
                        for name, value in _assigned_consts(stmt):
                            if value:
                                self.constants.setdefault(name, set()).add(value)

    def collect_paths(self) -> None:
        """self.<name> = <a path> anywhere, by name."""
        self.paths: dict[str, list[str]] = {}
        for cls in self.by_name.values():
            for fn in cls.body:
                if not isinstance(fn, ast.FunctionDef):
                    continue
                for n in ast.walk(fn):
                    if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute) \
                            and isinstance(n.targets[0].value, ast.Name) and n.targets[0].value.id == "self":
                        try:
                            vals = _Renderer(self, cls, fn).render(n.value)
                        except Unresolved:
                            continue
                        for v in vals:
                            if v.startswith("/v1/") and v not in self.paths.setdefault(n.targets[0].attr, []):
                                self.paths[n.targets[0].attr].append(v)

    def passed_helpers(self, cls: ast.ClassDef | None, attr: str):
        """(class, helper) for each construction of cls that passes a path
        helper of the constructing class (self.<helper>) as what __init__
        keeps in self.<attr>."""
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None) if cls else None
        if init is None:
            return
        params = [a.arg for a in init.args.args[1:]]
        kept = {n.value.id for n in ast.walk(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Attribute) and n.targets[0].attr == attr and isinstance(n.value, ast.Name)}
        for owner in self.by_name.values():
            for call in ast.walk(owner):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == cls.name):
                    continue
                given = dict(zip(params, call.args)) | {k.arg: k.value for k in call.keywords if k.arg}
                for p in kept:
                    v = given.get(p)
                    if isinstance(v, ast.Attribute) and isinstance(v.value, ast.Name) and v.value.id == "self":
                        h = self.helper(owner, v.attr)
                        if h is not None:
                            yield owner, h

    def literal_args(self, fn: ast.FunctionDef, param: str) -> list[str]:
        """The values callers (self.<fn>(…) anywhere) give param, if every
        one is a string literal; else none."""
        names = [a.arg for a in fn.args.args[1:]]
        index = names.index(param) if param in names else None
        values: list[str] = []
        for cls in self.by_name.values():
            for call in ast.walk(cls):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == fn.name
                        and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"):
                    continue
                given = {k.arg: k.value for k in call.keywords if k.arg}
                v = given.get(param)
                if v is None and index is not None and index < len(call.args):
                    v = call.args[index]
                if not (isinstance(v, ast.Constant) and isinstance(v.value, str)):
                    return []
                if v.value not in values:
                    values.append(v.value)
        return values

    def lineage(self, cls: ast.ClassDef | None):
        seen = set()
        while cls is not None and cls.name not in seen:
            seen.add(cls.name)
            yield cls
            base = next((b.id for b in cls.bases if isinstance(b, ast.Name) and b.id in self.by_name), None)
            cls = self.by_name.get(base) if base else None

    def helper(self, cls: ast.ClassDef | None, name: str) -> ast.FunctionDef | None:
        """A method of cls (or a base) that returns a path: its last statement returns a string."""
        for c in self.lineage(cls):
            for fn in c.body:
                if isinstance(fn, ast.FunctionDef) and fn.name == name and fn.body and isinstance(fn.body[-1], ast.Return):
                    ret = fn.body[-1].value
                    if isinstance(ret, ast.JoinedStr) or (isinstance(ret, ast.Constant) and isinstance(ret.value, str)):
                        return fn
        return None

    def attribute(self, cls: ast.ClassDef | None, name: str) -> tuple[list[ast.expr], ast.FunctionDef | None]:
        """What self.<name> is set to: a class attribute of cls or a base, else
        the assignments to self.<name> in their methods."""
        for c in self.lineage(cls):
            for stmt in c.body:
                for n, value in _assigned_consts(stmt):
                    if n == name:
                        return [ast.Constant(value)], None
        for c in self.lineage(cls):
            for fn in c.body:
                if isinstance(fn, ast.FunctionDef):
                    vals = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                            and isinstance(n.targets[0], ast.Attribute) and n.targets[0].attr == name
                            and isinstance(n.targets[0].value, ast.Name) and n.targets[0].value.id == "self"]
                    if vals:
                        return vals, fn
        return [], None


def _assigned_consts(stmt: ast.stmt):
    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
        for t in stmt.targets:
            if isinstance(t, ast.Name):
                yield t.id, stmt.value.value
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(stmt.value, ast.Constant) \
            and isinstance(stmt.value.value, str):
        yield stmt.target.id, stmt.value.value


def _assignments(fn: ast.FunctionDef) -> dict[str, list[ast.expr]]:
    out: dict[str, list[ast.expr]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out.setdefault(node.targets[0].id, []).append(node.value)
    return out


class _Renderer:
    def __init__(self, classes: _Classes, cls: ast.ClassDef | None, fn: ast.FunctionDef | None):
        self.classes, self.cls, self.fn = classes, cls, fn
        self.assigned = _assignments(fn) if fn else {}
        self.params = {a.arg for a in fn.args.args + fn.args.kwonlyargs} if fn else set()

    def render(self, e: ast.expr, bound: dict[str, list[str]] | None = None) -> list[str]:
        """All the templates e may be (a variable assigned in branches may be several)."""
        bound = bound or {}
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            return [e.value]
        if isinstance(e, ast.JoinedStr):
            outs = [""]
            for part in e.values:
                if isinstance(part, ast.Constant):
                    outs = [o + str(part.value) for o in outs]
                else:
                    outs = [o + v for o in outs for v in self._value(part.value, bound)]
            return outs
        if isinstance(e, ast.IfExp):
            return self.render(e.body, bound) + self.render(e.orelse, bound)
        if isinstance(e, ast.BinOp) and isinstance(e.op, ast.Add):
            return [a + b for a in self.render(e.left, bound) for b in self.render(e.right, bound)]
        if isinstance(e, ast.Name):
            if e.id in bound:
                return bound[e.id]
            if e.id in self.assigned:
                return [t for v in self.assigned[e.id] for t in self.render(v, bound)]
            if e.id in self.params:
                return ["{}"]  # an id the caller passes
            raise Unresolved(e.id)
        if isinstance(e, ast.Attribute):
            return self._attribute(e, bound)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and isinstance(e.func.value, ast.Name) \
                and e.func.value.id == "self":
            h = self.classes.helper(self.cls, e.func.attr)
            if h is not None:
                return self._helper(h, e, bound, self.cls)
            # self.<name> holds a bound path helper the constructing class
            # passed in (Desktop._base to DesktopRecordings): that one.
            out = []
            for owner, helper in self.classes.passed_helpers(self.cls, e.func.attr):
                out += self._helper(helper, e, bound, owner)
            if out:
                return out
        raise Unresolved(ast.unparse(e))

    def _value(self, e: ast.expr, bound: dict[str, list[str]]) -> list[str]:
        """A value put into an f-string: a path piece if it is one, else
        an id the SDK fills in ({})."""
        if isinstance(e, ast.Name) and e.id in bound:
            return bound[e.id]
        if isinstance(e, (ast.Attribute, ast.Call)):
            try:
                return self.render(e, bound)
            except Unresolved:
                return ["{}"]
        if isinstance(e, ast.Name) and e.id in self.assigned and e.id not in self.params:
            try:
                return self.render(e, bound)
            except Unresolved:
                return ["{}"]
        if isinstance(e, ast.Name) and e.id in self.params and self.fn is not None:
            # A verb every caller passes as a literal (self._lifecycle("stop", …)).
            verbs = self.classes.literal_args(self.fn, e.id)
            if verbs:
                return verbs
        return ["{}"]

    def _attribute(self, e: ast.Attribute, bound: dict[str, list[str]]) -> list[str]:
        """self.<name> from the class, else any constant a class gives
        <name> (self._machine._plural: every product's plural)."""
        if isinstance(e.value, ast.Name) and e.value.id == "self":
            values, fn = self.classes.attribute(self.cls, e.attr)
            if values:
                r = _Renderer(self.classes, self.cls, fn) if fn else self
                out = [t for v in values for t in r.render(v, {} if fn else bound)]
                if all(t.startswith("/") for t in out):
                    return out
            # Set from what a constructor was given: every path any class
            # sets self.<name> to.
            out = self.classes.paths.get(e.attr, [])
            if out:
                return out
        if e.attr in self.classes.constants:
            return sorted(self.classes.constants[e.attr])
        raise Unresolved(ast.unparse(e))

    def _helper(self, h: ast.FunctionDef, call: ast.Call, bound: dict[str, list[str]], cls: ast.ClassDef | None) -> list[str]:
        params = [a.arg for a in h.args.args[1:]]
        defaults = dict(zip(params[len(params) - len(h.args.defaults):], h.args.defaults))
        args: dict[str, list[str]] = {}
        for name, arg in zip(params, call.args):
            args[name] = self._arg(arg, bound)
        for kw in call.keywords:
            if kw.arg:
                args[kw.arg] = self._arg(kw.value, bound)
        for name in params:
            if name not in args:
                d = defaults.get(name)
                if d is None or not (isinstance(d, ast.Constant) and isinstance(d.value, str)):
                    # An id the caller passes: a placeholder.
                    args[name] = ["{}"]
                else:
                    args[name] = [d.value]
        return _Renderer(self.classes, cls, h).render(h.body[-1].value, args)

    def _arg(self, e: ast.expr, bound: dict[str, list[str]]) -> list[str]:
        """A helper's argument: a path piece, or an id computed at run time."""
        try:
            return self.render(e, bound)
        except Unresolved:
            return ["{}"]


def _calls(tree: ast.Module):
    """(enclosing class, enclosing function, call) for every request call."""
    def visit(node, cls, fn):
        for child in ast.iter_child_nodes(node):
            c, f = cls, fn
            if isinstance(child, ast.ClassDef):
                c = child
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                f = child
            if isinstance(child, ast.Call) and len(child.args) >= 2 and isinstance(child.args[0], ast.Constant) \
                    and child.args[0].value in METHODS:
                yield cls, fn, child
            yield from visit(child, c, f)
    yield from visit(tree, None, None)


def extract(package_dir: Path) -> tuple[set[str], list[str]]:
    """Routes ("METHOD /v1/…" with {} placeholders) and unresolved call sites."""
    files = sorted(package_dir.rglob("*.py"))
    trees = {f: ast.parse(f.read_text(), str(f)) for f in files}
    classes = _Classes(list(trees.values()))
    classes.paths = {}
    classes.collect_paths()
    routes: set[str] = set()
    unresolved: list[str] = []
    for f, tree in trees.items():
        rel = f.relative_to(package_dir).as_posix()
        for cls, fn, call in _calls(tree):
            params = {a.arg for a in fn.args.args} if fn else set()
            p = call.args[1]
            if isinstance(p, ast.Name) and p.id in params and p.id not in _assignments(fn):
                continue  # the transport's own plumbing: its callers are counted
            try:
                templates = _Renderer(classes, cls, fn).render(p)
            except Unresolved as e:
                unresolved.append(f"{rel}:{call.lineno}: {ast.unparse(p)} ({e})")
                continue
            for t in templates:
                t = t.split("?", 1)[0]
                if not t.startswith("/v1/"):
                    unresolved.append(f"{rel}:{call.lineno}: {ast.unparse(p)} renders as {t!r}")
                    continue
                routes.add(f"{call.args[0].value} {t}")
    return routes, unresolved


def installed() -> Path:
    import withruntime
    return Path(withruntime.__file__).resolve().parent


def read_list(path: Path = LIST) -> set[str]:
    return {ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


def main() -> int:
    import withruntime
    routes, unresolved = extract(installed())
    for u in unresolved:
        print("unresolved:", u, file=sys.stderr)
    if "--write" in sys.argv:
        head = (f"# Routes withruntime {withruntime.__version__} can call, extracted from its source by\n"
                "# tests/conformance/withruntime_routes.py --write; {} is a value the SDK fills in.\n")
        LIST.write_text(head + "".join(r + "\n" for r in sorted(routes)))
        print(f"wrote {len(routes)} routes to {LIST}")
    else:
        print("\n".join(sorted(routes)))
    return 1 if unresolved else 0


if __name__ == "__main__":
    sys.exit(main())
