"""The codebase's shape, measured (issue 28): sizes, long functions, import cycles and back doors.

  python benchmarks/code_shape.py [--json] [--root .] [--packages ihsweep,analysis]
      [--module-lines 500] [--function-lines 60]

Reads the packages' source with ``ast`` (nothing is imported) and reports:

* lines: every ``.py`` file's line count, their total outside ``tests/``, and the modules over
  ``--module-lines``;
* functions over ``--function-lines`` lines (methods included, nested ones counted on their own),
  longest first; the largest classes by methods and by the ``self.x`` attributes they assign;
* imports of the packages' own modules: at module level, inside functions (which hide the
  dependency graph; each imported module or name counts once per import statement), and through
  ``importlib.import_module`` of an own module or of a computed name;
* import cycles: the strongly connected components of the module graph (Tarjan), once over the
  module-level imports alone and once with in-function imports too; a package's ``__init__``
  counts as a module, and ``from pkg import mod`` as an import of ``pkg.mod`` when that module
  exists;
* private names used across modules: ``from m import _x`` or ``m._x`` where ``m`` is an own
  module other than the user's;
* exception classes (a base whose name ends in Error or Exception, or another exception class of
  the packages) and the files they live in, and the roots of their hierarchy (one root: one base).
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import sys

# Installed names of own packages (pyproject maps analysis/ to ihsweep_analysis).
ALIASES = {"ihsweep_analysis": "analysis"}


def _modules(root: str, packages: list[str]) -> dict[str, str]:
  """Own module name → path, for every ``.py`` file under the packages' directories."""
  out = {}
  for pkg in packages:
    for folder, _, files in os.walk(os.path.join(root, pkg)):
      for f in sorted(files):
        if f.endswith(".py"):
          rel = os.path.relpath(os.path.join(folder, f), root)[:-3].split(os.sep)
          name = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
          out[name] = os.path.join(folder, f)
  return out


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
  """The absolute module a ``from … import`` names (relative levels resolved)."""
  if not node.level:
    return node.module or ""
  parts = current.split(".")
  base = parts if is_package else parts[:-1]
  base = base[: len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


class _Visitor(ast.NodeVisitor):
  """Collects one module's imports (module level or in a function), function lengths, classes,
  ``importlib.import_module`` calls (of an own module, or with a computed name) and attribute
  uses of imported own modules."""

  def __init__(self, name: str, is_package: bool, own: set[str]):
    self.name, self.is_package, self.own = name, is_package, own
    self.depth = 0  # function nesting
    self.imports: list[tuple[str, bool]] = []  # (module, inside a function)
    self.private: list[tuple[str, str]] = []  # (module, name)
    self.aliases: dict[str, str] = {}  # local name → own module
    self.functions: list[tuple[str, int]] = []
    self.classes: list[dict] = []
    self.importlib: list[str] = []
    self.stack: list[str] = []

  def _own(self, module: str) -> str | None:
    if module.split(".")[0] in ALIASES:
      module = ".".join([ALIASES[module.split(".")[0]], *module.split(".")[1:]])
    while module and module not in self.own:
      module = module.rpartition(".")[0]
    return module or None

  def visit_Import(self, node):
    for a in node.names:
      mod = self._own(a.name)
      if mod:
        self.imports.append((mod, self.depth > 0))
        if a.asname:
          self.aliases[a.asname] = a.name if a.name in self.own else mod

  def visit_ImportFrom(self, node):
    base = _resolve(self.name, self.is_package, node)
    for a in node.names:
      full = f"{base}.{a.name}" if base else a.name
      if full in self.own:  # from pkg import module
        self.imports.append((full, self.depth > 0))
        self.aliases[a.asname or a.name] = full
        continue
      mod = self._own(base)
      if mod:
        self.imports.append((mod, self.depth > 0))
        if a.name.startswith("_") and not a.name.startswith("__") and mod != self.name:
          self.private.append((mod, a.name))

  def visit_Attribute(self, node):
    if isinstance(node.value, ast.Name) and node.value.id in self.aliases:
      mod = self.aliases[node.value.id]
      if node.attr.startswith("_") and not node.attr.startswith("__") and mod != self.name:
        self.private.append((mod, node.attr))
    self.generic_visit(node)

  def visit_Call(self, node):
    f = node.func
    called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    if called == "import_module" and node.args:
      arg = node.args[0]
      if not isinstance(arg, ast.Constant):  # computed: counted, it may name an own module
        self.importlib.append(ast.unparse(arg))
      elif self._own(str(arg.value)):
        self.importlib.append(repr(arg.value))
    self.generic_visit(node)

  def _function(self, node):
    qual = ".".join(self.stack + [node.name])
    self.functions.append((qual, node.end_lineno - node.lineno + 1))
    self.stack.append(node.name)
    self.depth += 1
    self.generic_visit(node)
    self.depth -= 1
    self.stack.pop()

  visit_FunctionDef = visit_AsyncFunctionDef = _function

  def visit_ClassDef(self, node):
    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    attrs = {
      t.attr
      for n in ast.walk(node)
      if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
      for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
      for t in (t.elts if isinstance(t, ast.Tuple) else [t])
      if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }
    bases = [ast.unparse(b) for b in node.bases]
    self.classes.append(
      dict(
        name=".".join(self.stack + [node.name]),
        lines=node.end_lineno - node.lineno + 1,
        methods=len(methods),
        attributes=len(attrs),
        bases=bases,
      )
    )
    self.stack.append(node.name)
    self.generic_visit(node)
    self.stack.pop()


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (or a self-import): the
  import cycles, each sorted, largest first (Tarjan's algorithm, iterative)."""
  index, low, on_stack, stack, out = {}, {}, set(), [], []
  counter = [0]
  for start in sorted(graph):
    if start in index:
      continue
    work = [(start, iter(sorted(graph.get(start, ()))))]
    index[start] = low[start] = counter[0]
    counter[0] += 1
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      for child in children:
        if child not in index:
          index[child] = low[child] = counter[0]
          counter[0] += 1
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph.get(child, ())))))
          break
        if child in on_stack:
          low[node] = min(low[node], index[child])
      else:
        work.pop()
        if work:
          low[work[-1][0]] = min(low[work[-1][0]], low[node])
        if low[node] == index[node]:
          comp = []
          while True:
            m = stack.pop()
            on_stack.discard(m)
            comp.append(m)
            if m == node:
              break
          if len(comp) > 1 or node in graph.get(node, ()):
            out.append(sorted(comp))
  return sorted(out, key=lambda c: (-len(c), c))


def measure(root: str, packages: list[str], module_lines=500, function_lines=60) -> dict:
  """The report as a dict (module docstring); paths relative to ``root``."""
  mods = _modules(root, packages)
  own = set(mods)
  lines, functions, classes, private, importlib_own = {}, [], [], [], []
  top, inner = collections.defaultdict(set), collections.defaultdict(set)
  n_inner = 0
  for name, path in sorted(mods.items()):
    with open(path, encoding="utf-8") as f:
      text = f.read()
    rel = os.path.relpath(path, root)
    lines[rel] = text.count("\n")
    v = _Visitor(name, path.endswith("__init__.py"), own)
    v.visit(ast.parse(text, rel))
    for mod, in_function in v.imports:
      if mod == name or name.startswith(mod + "."):  # itself, or its own package's __init__
        continue
      (inner if in_function else top)[name].add(mod)
      n_inner += in_function
    functions += [(f"{rel}:{q}", n) for q, n in v.functions]
    classes += [dict(c, name=f"{rel}:{c['name']}") for c in v.classes]
    private += sorted({f"{rel} uses {m}.{x}" for m, x in v.private})
    importlib_own += [f"{rel}: import_module({m})" for m in v.importlib]
  both = {m: top[m] | inner[m] for m in set(top) | set(inner)}
  exc_names = {"Exception", "ValueError", "RuntimeError", "OSError", "KeyError", "TypeError"}
  exceptions = []
  known = set()
  for _ in range(3):  # subclasses of the packages' own exceptions, a few levels deep
    for c in classes:
      short = c["name"].rsplit(":", 1)[1].rsplit(".", 1)[-1]
      if any(b.rsplit(".", 1)[-1] in exc_names | known or b.endswith("Error") for b in c["bases"]):
        known.add(short)
  exceptions = sorted(
    c["name"] for c in classes if c["name"].rsplit(":", 1)[1].rsplit(".", 1)[-1] in known
  )
  # the hierarchy's roots: own exception classes with no own exception class among their bases
  roots = [
    c["name"]
    for c in classes
    if c["name"] in exceptions and not any(b.rsplit(".", 1)[-1] in known for b in c["bases"])
  ]
  long_functions = sorted((f for f in functions if f[1] > function_lines), key=lambda f: -f[1])
  return {
    "packages": packages,
    "modules": len(lines),
    "lines_total": sum(lines.values()),
    "modules_over": {
      k: v for k, v in sorted(lines.items(), key=lambda kv: -kv[1]) if v > module_lines
    },
    "module_lines_limit": module_lines,
    "functions": len(functions),
    "functions_over": len(long_functions),
    "function_lines_limit": function_lines,
    "longest_functions": [f"{n} lines  {q}" for q, n in long_functions[:25]],
    "largest_classes": [
      f"{c['name']}: {c['lines']} lines, {c['methods']} methods, {c['attributes']} attributes"
      for c in sorted(classes, key=lambda c: -c["lines"])[:8]
    ],
    "own_imports_in_functions": n_inner,
    "import_cycles_module_level": strongly_connected(top),
    "import_cycles_with_function_imports": strongly_connected(both),
    "private_names_across_modules": private,
    "importlib_of_own_modules": importlib_own,
    "exception_classes": len(exceptions),
    "exception_files": len({e.split(":")[0] for e in exceptions}),
    "exceptions": exceptions,
    "exception_roots": sorted(roots),
  }


def _text(r: dict) -> str:
  out = [
    f"{r['modules']} modules in {', '.join(r['packages'])}, {r['lines_total']:,} lines; "
    f"{len(r['modules_over'])} over {r['module_lines_limit']} lines:",
    *(f"  {n:5d}  {p}" for p, n in r["modules_over"].items()),
    f"{r['functions']} functions, {r['functions_over']} over {r['function_lines_limit']} lines; "
    f"longest:",
    *(f"  {f}" for f in r["longest_functions"][:15]),
    "largest classes:",
    *(f"  {c}" for c in r["largest_classes"]),
    f"own-module imports inside functions: {r['own_imports_in_functions']}",
    f"import cycles (module-level imports): {len(r['import_cycles_module_level'])}",
    *(f"  {' ↔ '.join(c)}" for c in r["import_cycles_module_level"]),
    f"import cycles (with in-function imports): {len(r['import_cycles_with_function_imports'])}",
    *(f"  {' ↔ '.join(c)}" for c in r["import_cycles_with_function_imports"]),
    f"private names used across modules: {len(r['private_names_across_modules'])}",
    *(f"  {p}" for p in r["private_names_across_modules"]),
    f"importlib of own modules: {len(r['importlib_of_own_modules'])}",
    *(f"  {p}" for p in r["importlib_of_own_modules"]),
    f"exception classes: {r['exception_classes']} in {r['exception_files']} files, "
    f"{len(r['exception_roots'])} root(s): {', '.join(r['exception_roots'])}",
  ]
  return "\n".join(out)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."))
  p.add_argument("--packages", default="ihsweep,analysis", help="comma-separated folders")
  p.add_argument("--module-lines", type=int, default=500)
  p.add_argument("--function-lines", type=int, default=60)
  args = p.parse_args(argv)
  report = measure(
    os.path.abspath(args.root),
    [x for x in args.packages.split(",") if x],
    args.module_lines,
    args.function_lines,
  )
  print(json.dumps(report, indent=1) if args.json else _text(report))
  return 0


if __name__ == "__main__":
  sys.exit(main())
