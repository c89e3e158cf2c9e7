"""The folders are layers (docs/architecture.md, "Layers"): `lint-imports` checks the imports in
`make test`; here, that its layers contract names every folder, and that each name has one
address (a module imports a name from the module that defines it, not through one that only
imported it)."""

import ast
import pathlib

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("ihsweep", "analysis")
CALLERS = ("ihsweep", "analysis", "tests", "benchmarks", "configs", "launch")


def _contract(contract_id: str) -> dict:
  config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
  return next(c for c in config["contracts"] if c["id"] == contract_id)


def test_the_layers_contract_names_every_folder_and_module_of_the_package():
  layers = _contract("layers")["layers"]
  folders = {
    f"ihsweep.{p.name}" for p in (ROOT / "ihsweep").iterdir() if (p / "__init__.py").exists()
  }
  modules = {
    f"ihsweep.{p.stem}" for p in (ROOT / "ihsweep").glob("*.py") if p.name != "__init__.py"
  }
  assert set(layers) == folders | modules | {"analysis"}, set(layers) ^ (folders | modules)
  assert len(layers) == len(set(layers))


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_modules() -> dict[str, pathlib.Path]:
  return {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _top_level(path: pathlib.Path) -> tuple[set, dict]:
  """Names a module defines, and those it imports (local name → (module, name))."""
  defined, imported = set(), {}
  module = _module_name(path)
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      defined.add(node.name)
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        defined |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    elif isinstance(node, ast.ImportFrom):
      source = _resolve(module, node, path.name == "__init__.py")
      for alias in node.names:
        imported[alias.asname or alias.name] = (source, alias.name, alias.asname)
  return defined, imported


def _all_names(path: pathlib.Path) -> list[str]:
  """The strings of a module's ``__all__`` (empty without one)."""
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
    ):
      return [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)]
  return []


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
  if not node.level:
    return node.module or ""
  base = module.split(".")[: None if is_package else -1]
  base = base[: len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


def test_each_name_has_one_address():
  """No `from x import y as y` re-export and no imported name in `__all__` outside a package's
  __init__, no `from m import y` or `m.y` where m only imported y from a module of ours (tests
  and benchmarks included)."""
  modules = _package_modules()
  tops = {name: _top_level(path) for name, path in modules.items()}
  ours = lambda source: source.split(".")[0] in PACKAGES and source in modules  # noqa: E731
  problems = []
  for name, (defined, imported) in tops.items():
    if modules[name].name != "__init__.py":
      problems += [
        f"{modules[name]}: re-exports {n} from {src}"
        for n, (src, orig, asname) in imported.items()
        if asname == orig and ours(src)
      ]
      problems += [
        f"{modules[name]}: __all__ lists {n}, imported from {imported[n][0]}"
        for n in _all_names(modules[name])
        if n in imported and n not in defined
      ]
  callers = [p for d in CALLERS for p in (ROOT / d).rglob("*.py") if ".venv" not in p.parts]
  for path in callers:
    module = _module_name(path)
    tree = ast.parse(path.read_text())
    aliases = {}
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):
        source = _resolve(module, node, path.name == "__init__.py")
        for alias in node.names:
          full = f"{source}.{alias.name}"
          if full in modules:
            aliases[alias.asname or alias.name] = full
          elif ours(source) and modules[source].name != "__init__.py":
            defined, imported = tops[source]
            if alias.name in imported and alias.name not in defined:
              via = imported[alias.name][0]
              problems.append(f"{path}:{node.lineno}: {alias.name} from {source}, not {via}")
    for node in ast.walk(tree):
      if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in aliases
      ):
        target = aliases[node.value.id]
        defined, imported = tops[target]
        source = imported.get(node.attr, ("",))[0]
        if node.attr not in defined and ours(source) and modules[target].name != "__init__.py":
          problems.append(
            f"{path}:{node.lineno}: {node.value.id}.{node.attr} is {target}'s import from {source}"
          )
  assert not problems, "\n".join(sorted(set(problems)))


def test_lint_imports_is_in_make_test_and_the_dev_extra():
  makefile = (ROOT / "Makefile").read_text()
  test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
  assert "$(BIN)/lint-imports" in test_recipe
  pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
  dev = pyproject["project"]["optional-dependencies"]["dev"]
  assert any(d.startswith("import-linter") for d in dev)
