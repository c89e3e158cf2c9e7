"""The installed project, seen from outside the repository: the analysis/ folder is importable as
``ihsweep_analysis`` (never as a top-level ``analysis``, which would clash with any other package
of that name), and ``ihsweep report`` / ``ihsweep fit-law`` reach it from any directory."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(cmd, cwd):
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only what is installed
  return subprocess.run(
    cmd, cwd=cwd, env={**env, "JAX_PLATFORMS": "cpu"}, capture_output=True, text=True, timeout=300
  )


def _ihsweep():
  exe = shutil.which("ihsweep", path=os.path.dirname(sys.executable))
  assert exe, f"no ihsweep console script beside {sys.executable}: `pip install -e .` first"
  return exe


def test_every_package_folder_is_installed_and_analysis_under_its_own_name():
  tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    setup = tomllib.load(f)["tool"]["setuptools"]
  folders = {"ihsweep": "ihsweep", "analysis": "ihsweep_analysis"}
  found = set()
  for folder, name in folders.items():
    for here, _, files in os.walk(os.path.join(ROOT, folder)):
      if "__init__.py" in files:
        rel = os.path.relpath(here, os.path.join(ROOT, folder))
        found.add(name + ("" if rel == "." else "." + rel.replace(os.sep, ".")))
  assert sorted(setup["packages"]) == sorted(found), (
    "pyproject.toml [tool.setuptools] packages must list every package folder "
    f"(a wheel leaves the others out): listed {setup['packages']}, found {sorted(found)}"
  )
  assert setup["package-dir"] == {"ihsweep_analysis": "analysis"}
  assert not any(p == "analysis" or p.startswith("analysis.") for p in setup["packages"])


def test_analysis_commands_work_from_any_directory_and_analysis_does_not_clash(tmp_path):
  exe = _ihsweep()
  for command in ("report", "fit-law"):
    r = _run([exe, command, "--help"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: ihsweep {command} "), r.stdout
  r = _run([exe, "--help"], tmp_path)
  assert "report" in r.stdout and "fit-law" in r.stdout
  # a fit from a CSV written outside the repository: points on the study's law, 3 x 3 (B, C)
  rows = ["batch_size,context_size,emergence_step"]
  for i, b in enumerate((8, 16, 32)):
    for j, c in enumerate((64, 128, 256)):
      scatter = math.exp(0.05 * ((i * 3 + j) % 3 - 1))  # deterministic, so sigma > 0
      rows.append(f"{b},{c},{math.exp(13.26) / b**0.37 / c**0.62 * scatter:.1f}")
  (tmp_path / "points.csv").write_text("\n".join(rows) + "\n")
  r = _run([exe, "fit-law", "--csv", "points.csv", "--n_boot", "0"], tmp_path)
  assert r.returncode == 0, r.stderr
  law = json.loads(r.stdout)
  assert law["n"] == 9 and abs(law["alpha"] - 0.37) < 0.1 and abs(law["beta"] - 0.62) < 0.1, law
  r = _run([exe, "fit-law", "--csv", "missing.csv"], tmp_path)
  assert r.returncode == 2 and r.stderr.startswith("ihsweep: --csv missing.csv: cannot read")
  # outside the repository `analysis` is not ours (not installed under that name) ...
  r = _run([sys.executable, "-c", "import analysis; print(analysis.__file__)"], tmp_path)
  assert r.returncode != 0 or not os.path.realpath(r.stdout.strip()).startswith(ROOT), r.stdout
  # ... while ihsweep_analysis is: the repository's analysis/ folder (editable install, as
  # `make` does) or its copy in site-packages (a wheel)
  code = "import ihsweep_analysis.report as m; print(m.__file__)"
  r = _run([sys.executable, "-c", code], tmp_path)
  assert r.returncode == 0, r.stderr
  path = os.path.realpath(r.stdout.strip())
  assert path in (
    os.path.join(os.path.realpath(ROOT), "analysis", "report.py"),
    os.path.join(os.path.dirname(os.path.dirname(path)), "ihsweep_analysis", "report.py"),
  ), path


def test_python_m_analysis_still_works_from_the_repository():
  r = _run([sys.executable, "-m", "analysis", "fit-law", "--help"], ROOT)
  assert r.returncode == 0, r.stderr
  assert r.stdout.startswith("usage: python -m analysis fit-law "), r.stdout


def test_import_ihsweep_beside_a_folder_named_ihsweep(tmp_path):
  """A notebook started in the folder that holds a clone named ``ihsweep``: the clone (no
  ``__init__.py`` at its top) must not shadow the installed package as an empty namespace
  package (setuptools' editable finder comes after the path's folders; `make install` puts it
  first with ihsweep-first.pth)."""
  (tmp_path / "ihsweep" / "docs").mkdir(parents=True)  # a clone's top level, as a folder
  code = "import ihsweep; print(ihsweep.__file__, hasattr(ihsweep, 'load_run'))"
  r = _run([sys.executable, "-c", code], tmp_path)
  assert r.returncode == 0, r.stderr
  path, has = r.stdout.split()
  assert has == "True" and path != "None" and not path.startswith(str(tmp_path)), r.stdout
