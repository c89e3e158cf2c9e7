"""The commands that README.md and docs/*.md show, run; and every file, module and name that a
doc, or a string or comment of the code, cites, found.

**Which blocks run.** A fenced block whose info string is ``bash``, ``sh`` or ``shell`` holds
commands, one per line (``\\`` continues a line, ``#`` starts a comment). Each runs here, after
the rewrites below, unless an HTML comment on the lines right above its fence says otherwise:

  <!-- not run: REASON -->           none of the block's commands
  <!-- not run (TEXT): REASON -->    the block's commands that contain TEXT

A ``python`` block is run by another test (tests/test_notebook.py runs every one that reads
``runs/demo``, tests/test_export.py the TransformerLens one; checked here).
A block without an info string, or ``text``, is output or a diagram, and may not hold a line
that starts like a command (a command block left unlabelled would never run).

**Rewrites** (what "at a tiny scale" means here; ``rewrite`` applies them):

1. ``ihsweep ARGS`` (or ``.venv/bin/ihsweep``) runs ``ihsweep.cli.main`` in this process,
   ``python -m analysis ARGS`` ``analysis.__main__.main``; ``make TARGET [VAR=V]`` runs ``make
   -n`` (prints the recipe, runs nothing), then the recipe's ``.venv/bin/ihsweep run`` lines
   as ``ihsweep`` commands (``make demo DEMO_FLAGS=…``: the flags reach ``run``); a launcher
   (``launch/X``, ``bash launch/X``, ``sbatch [OPTIONS] launch/X``) runs as ``bash launch/X
   ARGS --dry-run`` (prints what it would start, after checking that the .venv/bin/ihsweep it
   finds and the config file exist); other words (``python benchmarks/...``) must be marked.
2. A run directory that a command reads (``status``/``export`` ``--workdir``, ``report``'s
   directories, ``--law=…/law.json`` or any law file, ``--csv points.csv``) is a made-up sweep,
   made once by ``fake_sweep`` (configs/induction.py, B 8, 32 × C 32, 64 × 2 seeds, ps_max curves
   written into metrics.jsonl, no checkpoints); the second directory of one command (``report runs/a
   runs/b``) is its copy; ``points.csv`` is its report's emergence.csv and a law file its
   law.json. A directory that a command writes (``run``/``train`` ``--workdir``, ``--out``) is a
   new one under the test's temporary folder (the same path in the docs: the same directory).
3. Placeholders: ``FILE`` (a word, or a flag's ``=FILE``) → configs/default.py:tiny,
   ``TPU_NAME ZONE`` → ``my-tpu us-central2-b`` (``DIR`` stays: a launcher's dry run only
   prints it); ``[…]`` (optional parts) are left out; ``~`` is a temporary HOME holding a few
   text files; the python-docs corpus is tests/conftest.py's stand-in.
4. A command that would compile the trainer's programs (``run``, ``train``, a ``plan`` that
   measures) runs up to its first train or init program, where ``Compiling`` stops it: what it
   checks is everything before — its flags, the config and every override, the grid and the
   rules between fields, the data source built (corpus, BPE, bigram statistics) and the run
   directory. A ``--target`` plan runs so in a process of its own (the target's compiler joins
   JAX's plugins when JAX starts). Compiling and training are tests/test_train.py's and
   test_sweep.py's.
5. Commands that are equal after the rewrites run once.
6. A comment that says a command ``prints "TEXT"`` is checked: the command's output holds TEXT
   (spaces aside), so that an output a doc quotes is what the command prints.

**What the reader is told.** A block whose commands rules 1–4 change carries, on the lines right
above its fence, one note that says how (``CHANGES``: the words it must hold for each change
its run commands get, and may not hold for the others); a block run as written carries none:

  <!-- tests/test_docs.py runs this with: run stopped at its first compile; status reads a
  made-up sweep -->  (on one line)

The file takes ~40 s of CPU (user + sys, the imports of JAX, flax and the analysis and the two
--target subprocesses included; 50-65 s wall on the 2-core machine under a load of 7-10).
"""

import ast
import dataclasses
import functools
import io
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
SHELL = ("bash", "sh", "shell")
NOT_RUN = re.compile(r"<!-- not run(?: \((?P<text>[^)]+)\))?: (?P<reason>.+?) -->")
# How a line of a text block or a command starts (an unlabelled command block would not run).
COMMAND_START = re.compile(r"((\.venv/bin/)?(ihsweep|python3?|make|sbatch|bash)|launch/\S+)(\s|$)")
PLACEHOLDERS = {"FILE": "configs/default.py:tiny", "TPU_NAME": "my-tpu", "ZONE": "us-central2-b"}
TRAINERS = {"run", "train", "plan"}  # commands stopped at their first compile (rule 4)
NOTE = re.compile(r"<!-- tests/test_docs\.py runs this with: (?P<text>.+?) -->")
# What the rewrites change in a command, and the words that say so in its block's note.
CHANGES = {
  "compile": "first compile",  # rule 4
  "make": "make -n",  # rule 1
  "dry-run": "--dry-run",  # rule 1: a launcher
  "sbatch": "sbatch → bash",  # rule 1
  "sweep": "made-up sweep",  # rule 2: a run directory, law file or points.csv read
  "FILE": "FILE → configs/default.py:tiny",  # rule 3
  "TPU": "TPU_NAME ZONE → my-tpu us-central2-b",  # rule 3
  "optional": "[…] left out",  # rule 3
  "home": "~ → a temporary HOME",  # rule 3
}
OPTIONAL = re.compile(r"\s*\[[^\[\]]*\]")


@dataclasses.dataclass
class Block:
  doc: str
  line: int  # of the opening fence, from 1
  info: str
  notes: list  # the HTML comment lines right above the fence
  text: str


@dataclasses.dataclass
class Command:
  doc: str
  line: int
  text: str  # as shown, continuation lines joined
  not_run: str | None  # the reason, where a marker says so

  @property
  def id(self) -> str:
    return f"{self.doc}:{self.line}: {self.text[:70]}"


def blocks(doc: str) -> list[Block]:
  """The fenced blocks of ``doc`` (relative to the repository root)."""
  lines = (ROOT / doc).read_text().split("\n")
  found, i = [], 0
  while i < len(lines):
    m = re.match(r"\s*```(\S*)\s*$", lines[i])
    if not m:
      i += 1
      continue
    start, j = i, i + 1
    while not lines[j].strip().startswith("```"):
      j += 1
    notes, k = [], start - 1
    while k >= 0 and re.fullmatch(r"<!--.*-->", lines[k].strip()):
      notes.insert(0, lines[k].strip())
      k -= 1
    found.append(Block(doc, start + 1, m.group(1), notes, "\n".join(lines[start + 1 : j])))
    i = j + 1
  return found


def _markers(block: Block) -> list[re.Match]:
  return [m for m in map(NOT_RUN.fullmatch, block.notes) if m]


def commands(block: Block) -> list[Command]:
  """The commands of a shell block, each with the reason it is not run where a marker says so."""
  out, line, start = [], "", None
  for n, raw in enumerate(block.text.split("\n"), start=block.line + 1):
    start = start or n
    line += raw
    if line.endswith("\\"):
      line = line[:-1]
      continue
    text = " ".join(line.split())
    if text and not text.startswith("#"):
      reasons = [m["reason"] for m in _markers(block) if not m["text"] or m["text"] in text]
      out.append(Command(block.doc, start, text, reasons[0] if reasons else None))
    line, start = "", None
  return out


ALL_BLOCKS = [b for doc in DOCS for b in blocks(doc)]
ALL_COMMANDS = [c for b in ALL_BLOCKS if b.info in SHELL for c in commands(b)]
TO_RUN = [c for c in ALL_COMMANDS if c.not_run is None]


def test_every_block_is_commands_python_or_text():
  """Every fence says what it holds: a shell block's commands run (or are marked), a python
  block is another test's; a block without a label holds no command."""
  for b in ALL_BLOCKS:
    where = f"{b.doc}:{b.line}"
    assert b.info in (*SHELL, "python", "text", ""), f"{where}: fence info {b.info!r}"
    if b.info in ("", "text"):
      bad = [line for line in b.text.split("\n") if COMMAND_START.match(line.strip())]
      assert not bad, f"{where}: commands in a block without a shell label: {bad}"
    if b.info not in SHELL:
      assert not _markers(b), f"{where}: a not-run marker above a block that is not shell"


def test_every_not_run_marker_names_commands_and_a_reason():
  for b in ALL_BLOCKS:
    for m in _markers(b):
      cmds = commands(b)
      hits = [c for c in cmds if not m["text"] or m["text"] in c.text]
      assert hits, f"{b.doc}:{b.line}: {m.group(0)} matches none of {[c.text for c in cmds]}"
      assert len(m["reason"].split()) >= 3, f"{b.doc}:{b.line}: say why: {m.group(0)}"
    notes = [n for n in b.notes if "not run" in n and not NOT_RUN.fullmatch(n)]
    assert not notes, f"{b.doc}:{b.line}: not the marker's form {NOT_RUN.pattern}: {notes}"


def test_a_block_the_test_changes_says_how_beside_it():
  """Rules 1–4 change most commands (a run directory made up, training stopped at its first
  compile, a launcher's dry run): a block whose run commands they change says how in one note
  right above its fence, with CHANGES' words for each change and for no other; a block run as
  written has no note."""
  problems = []
  for b in ALL_BLOCKS:
    where = f"{b.doc}:{b.line}"
    notes = [m for m in map(NOTE.fullmatch, b.notes) if m]
    odd = [n for n in b.notes if "test_docs.py" in n and not NOTE.fullmatch(n)]
    if odd:
      problems.append(f"{where}: not the note's form {NOTE.pattern}: {odd}")
    run = [c for c in commands(b) if c.not_run is None] if b.info in SHELL else []
    made = set().union(*map(changes, run))
    said = " ".join(m["text"] for m in notes)
    if len(notes) > 1:
      problems.append(f"{where}: {len(notes)} notes; one says it all")
    if made and not notes:
      wanted = "; ".join(CHANGES[k] for k in sorted(made))
      problems.append(f"{where}: add <!-- tests/test_docs.py runs this with: … --> saying {wanted}")
    elif notes and not made:
      problems.append(f"{where}: run as written (or not run): no note")
    elif notes:
      missing = [CHANGES[k] for k in sorted(made) if CHANGES[k] not in said]
      wrong = [v for k, v in CHANGES.items() if k not in made and v in said]
      if missing:
        problems.append(f"{where}: the note does not say {missing}")
      if wrong:
        problems.append(f"{where}: the note says {wrong}, which the test does not do here")
  assert not problems, "\n".join(problems)


def test_the_note_check_finds_a_missing_wrong_or_needless_note(monkeypatch):
  """A changed block without a note, a note that leaves a change out or names one not made,
  and a note beside a block run as written: each found."""
  doc = ROOT / "docs" / "x.md"
  text = (
    "<!-- tests/test_docs.py runs this with: train stopped at its first compile -->\n"
    "```bash\nihsweep run --config=configs/demo.py --workdir=runs/a\n"
    "ihsweep status --workdir=runs/a\n```\n\n"
    "```bash\nlaunch/local.sh --config=FILE --workdir=DIR\n```\n\n"
    "<!-- tests/test_docs.py runs this with: a made-up sweep, --dry-run -->\n"
    "```bash\nihsweep status --workdir=runs/a\n```\n\n"
    "<!-- tests/test_docs.py runs this with: make -n -->\n"
    "```bash\nihsweep predict --batch_size=8 --context_size=64\n```\n"
  )
  monkeypatch.setattr(pathlib.Path, "read_text", lambda self, *a, **k: text)
  monkeypatch.setattr(sys.modules[__name__], "ALL_BLOCKS", blocks(str(doc.relative_to(ROOT))))
  with pytest.raises(AssertionError) as e:
    test_a_block_the_test_changes_says_how_beside_it()
  found = str(e.value)
  assert "docs/x.md:2: the note does not say ['made-up sweep']" in found
  assert (
    "docs/x.md:7: add <!-- tests/test_docs.py runs this with: … --> saying FILE → "
    "configs/default.py:tiny; --dry-run" in found
  )
  assert "docs/x.md:12: the note says ['--dry-run'], which the test does not do here" in found
  assert "docs/x.md:17: run as written (or not run): no note" in found


def test_every_python_block_is_run_by_a_test():
  """tests/test_notebook.py runs every python block of the docs that reads runs/ (the one
  after ``<!-- export-example -->`` is tests/test_export.py's, which runs it on a model that
  formed an induction head)."""
  import test_notebook

  run_there = set(test_notebook._readme_blocks().values())
  export_test = (ROOT / "tests" / "test_export.py").read_text()
  for b in ALL_BLOCKS:
    if b.info != "python":
      continue
    if "<!-- export-example -->" in b.notes:
      assert '"<!-- export-example -->\\n```python\\n"' in export_test
    else:
      assert b.text in run_there, f"{b.doc}:{b.line}: a python block no test runs"


# ---------------------------------------------------------------- running them


class Compiling(BaseException):  # noqa: N818 - not an error: where rule 4 stops a command
  """Raised where a command would compile the trainer's first program (rule 4)."""


def _stop(*args, **kwargs):
  raise Compiling()


def _words(text: str) -> list[str]:
  text = OPTIONAL.sub("", text)  # optional parts: left out (rule 3)
  return shlex.split(text, comments=True)


@dataclasses.dataclass
class Place:
  """Where rule 2 points a command's paths."""

  tmp: pathlib.Path
  sweep: str  # the fake sweep, reported
  copy: str  # a second one
  made: dict = dataclasses.field(default_factory=dict)

  def new(self, shown: str) -> str:
    """A new directory for a path the docs write to (the same path: the same directory)."""
    if shown not in self.made:
      self.made[shown] = str(self.tmp / "made" / f"d{len(self.made)}")
    return self.made[shown]

  def reported(self, name: str) -> str:
    """``name`` in the fake sweep's report (law.json, emergence.csv), reported here if no
    command has yet."""
    path = os.path.join(self.sweep, "analysis", name)
    if not os.path.exists(path):
      from analysis import report

      report.report([self.sweep], None, report.Options(progress=False, source="online"))
    return path

  def read(self, shown: str, seen: list) -> str:
    """The fake sweep, or its copy for the second distinct directory a command reads."""
    if shown not in seen:
      seen.append(shown)
    return self.sweep if seen.index(shown) == 0 else self.copy


def rewrite(words: list[str], place: Place, changed: set | None = None) -> tuple[str, list[str]]:
  """``(how, argv)`` of a command's words (rules 1–3): how is ``ihsweep``, ``analysis``,
  ``make`` or ``bash``. ``changed`` gains the ``CHANGES`` of rules 1–3 made here."""
  changed = set() if changed is None else changed
  for w in words:
    value = w.partition("=")[2] if w.startswith("--") else w
    if value in PLACEHOLDERS:
      changed.add("FILE" if value == "FILE" else "TPU")
  words = [PLACEHOLDERS.get(w, w) for w in words]
  words = [  # --config=FILE too: a launcher's dry run checks that the file exists
    f"{w.partition('=')[0]}={PLACEHOLDERS[w.partition('=')[2]]}"
    if w.startswith("--") and w.partition("=")[2] in PLACEHOLDERS
    else w
    for w in words
  ]
  if words[0] == "make":
    changed.add("make")
    return "make", ["make", "-n", *words[1:]]
  if words[0] == "sbatch":  # its options are SLURM's; the script prints what a task runs
    changed.add("sbatch")
    words = ["bash", *words[next(i for i, w in enumerate(words) if w.startswith("launch/")) :]]
  if words[0].startswith("launch/"):
    words = ["bash", *words]
  if words[0] == "bash":
    if "--dry-run" not in words:
      changed.add("dry-run")
    return "bash", [*words, "--dry-run"]
  if words[0] in ("ihsweep", ".venv/bin/ihsweep"):
    how, args = "ihsweep", words[1:]
  elif words[:3] == ["python", "-m", "analysis"]:
    how, args = "analysis", words[3:]
  else:
    raise AssertionError(f"no rule runs {words[0]!r}: mark it (<!-- not run: REASON -->)")
  command, seen, out = args[0], [], [args[0]]
  reads = command in ("status", "export")
  rest = iter(args[1:])
  for a in rest:
    key, _, value = a.partition("=")
    if key == "--workdir":
      a = f"--workdir={place.read(value, seen) if reads else place.new(value)}"
      changed |= {"sweep"} if reads else set()
    elif key == "--law":
      a = f"--law={place.reported('law.json')}"
      changed.add("sweep")
    elif a in ("--out", "--csv"):
      value = next(rest)
      path = place.reported("emergence.csv") if a == "--csv" else place.new(value)
      changed |= {"sweep"} if a == "--csv" else set()
      out += [a, path]
      continue
    elif command == "report" and not a.startswith("-"):
      a = place.read(a, seen)
      changed.add("sweep")
    out.append(a)
  return how, out


class _Named(Place):
  """rewrite's paths named, nothing made or reported: what a command's rewrite changes."""

  def reported(self, name: str) -> str:
    return name


@functools.cache
def _make_runs(argv: tuple) -> tuple:
  """The ``.venv/bin/ihsweep run`` lines of the recipe that ``make -n ARGS`` prints (rule 1)."""
  r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, f"{shlex.join(argv)}: exit {r.returncode}\n{r.stdout}{r.stderr}"
  return tuple(line for line in r.stdout.splitlines() if line.startswith(".venv/bin/ihsweep run "))


def _compiles(how: str, argv: list[str]) -> bool:
  """Rule 4: a ``run``, ``train`` or measuring ``plan`` (no ``--flops_per_s``), not ``--help``."""
  return (
    how == "ihsweep"
    and argv[0] in TRAINERS
    and not any(a in ("--help", "-h", "--helpfull") or a.startswith("--flops_per_s") for a in argv)
  )


def changes(command: Command) -> set[str]:
  """The ``CHANGES`` that rules 1–4 make to a command, found without running it."""
  out = set()
  shown = shlex.split(command.text, comments=True)
  words = _words(command.text)
  if words != shown:
    out.add("optional")
  if re.search(r"(^|[\s=,])~/", " ".join(words)):
    out.add("home")
  named = _Named(pathlib.Path("/nonexistent"), "SWEEP", "COPY")
  try:
    how, argv = rewrite(words, named, out)
  except AssertionError:  # no rule runs it: test_the_command_runs says so
    return out
  runs = [(how, argv)]
  if how == "make":
    runs = [rewrite(_words(line), named, out) for line in _make_runs(tuple(argv))]
  if any(_compiles(h, a) for h, a in runs):
    out.add("compile")
  return out


def _clean_env(tmp: pathlib.Path) -> dict:
  """This environment without what the launchers read (as tests/test_launch.py's): IHSWEEP
  unset, so that a launcher finds ihsweep as from a fresh clone (PATH, else .venv/bin), its
  dry run checking it; a stand-in gcloud on PATH (launch/tpu_pod.sh's dry run checks for one)."""
  keep = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("IHSWEEP", "XLA_", "SLURM_", "OMP_", "CUDA_VISIBLE_DEVICES"))
  }
  stand_ins = tmp / "bin"
  if not (stand_ins / "gcloud").exists():
    stand_ins.mkdir(exist_ok=True)
    (stand_ins / "gcloud").write_text("#!/bin/sh\nexit 0\n")
    (stand_ins / "gcloud").chmod(0o755)
  return {**keep, "PATH": f"{keep.get('PATH', '')}:{stand_ins}"}


def _in_process(how: str, argv: list[str]) -> int:
  from absl import flags

  try:
    if how == "analysis":
      from analysis import __main__ as analysis_main

      return analysis_main.main(argv)
    from ihsweep import cli

    return cli.main(["ihsweep", *argv])
  finally:  # the next command defines its own --config.* overrides
    for name in [n for n in flags.FLAGS if n.startswith("config.")]:
      delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()


COMPILING_EXIT = 86  # a --target plan's process, stopped at its first compile (rule 4)


def _target_plan(argv: list[str]) -> int:
  """``ihsweep plan --target=…`` in a process of its own, as a user runs it (the target's
  compiler joins JAX's plugins when JAX starts; this process's JAX has started), without the
  tests' 4 fake CPU devices; its first train or init program ends it with COMPILING_EXIT."""
  code = (
    "import os, sys\n"
    "from ihsweep.compute import train\n"
    "def stop(*args, **kwargs):\n"
    "  sys.stdout.flush(); sys.stderr.flush(); os._exit(%d)\n"
    "train.make_init_fn = train.make_ensemble_train_fn = stop\n"
    "from ihsweep import cli\n"
    "sys.exit(cli.main(['ihsweep', *sys.argv[1:]]))\n"
  ) % COMPILING_EXIT
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  r = subprocess.run(
    [sys.executable, "-c", code, *argv], cwd=ROOT, env=env, capture_output=True, text=True,
    timeout=300,
  )  # fmt: skip
  if r.returncode not in (0, COMPILING_EXIT):
    print(r.stdout[-2000:], r.stderr[-3000:])
  return r.returncode


def _words_text(n_words: int, n_lines: int, seed: int) -> str:
  """Made-up English-like text of ``n_words`` distinct words: enough pairs for a BPE of
  configs/default.py's 4,096 types."""
  import random

  rng = random.Random(seed)
  syl = "ar be co de el fi go hu in jo ka le mi no op pu qu ra si te un vo wa xe yo ze".split()
  words = list({"".join(rng.choice(syl) for _ in range(rng.randint(2, 5))) for _ in range(n_words)})
  return "\n".join(" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(n_lines))


def fake_sweep(workdir: str) -> str:
  """conftest's sigmoid sweep over B {8, 32} × C {32, 64}, every seed rising at UPT = e^9.5 /
  (B^0.8 · C^0.2), seed 1 10% later; no checkpoints."""
  from conftest import write_sigmoid_sweep

  return write_sigmoid_sweep(workdir, (8, 32), (32, 64), c_exponent=0.2)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
  """The fake sweep, its copy, a HOME with text files and a cache with the stand-in
  python-docs corpus; the trainer's programs stopped at their first compile (rule 4)."""
  from conftest import write_python_docs_corpus

  from ihsweep.compute import train

  tmp = tmp_path_factory.mktemp("docs")
  sweep = fake_sweep(str(tmp / "sweep"))
  copy = str(tmp / "copy")
  shutil.copytree(sweep, copy)
  home = tmp / "home"
  for path, text in (("text/a/notes.md", _words_text(6000, 4000, 1)), ("more/b.jsonl", "")):
    (home / path).parent.mkdir(parents=True)
    (home / path).write_text(text)
  (home / "more" / "b.jsonl").write_text(json.dumps({"text": _words_text(500, 50, 2)}) + "\n")
  cache = tmp / "cache"
  corpus = write_python_docs_corpus(cache)
  (pathlib.Path(corpus) / "library" / "more.rst.txt").write_text(_words_text(6000, 4000, 3))
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("HOME", str(home))
    mp.setenv("IHSWEEP_CACHE", str(cache))
    mp.setattr(train, "make_init_fn", _stop)
    mp.setattr(train, "make_ensemble_train_fn", _stop)
    mp.chdir(ROOT)
    yield Place(tmp, sweep, copy)


@functools.cache
def _targets_present() -> bool:
  return (ROOT / "build" / "libtpu").is_dir() and (ROOT / "build" / "jax-cuda").is_dir()


_DONE: dict = {}  # rule 5: (how, argv) -> what the command printed
PRINTS = re.compile(r'# .*?prints "([^"]+)"')  # rule 6


def _run(command: Command, how: str, argv: list[str], capfd, place: Place) -> tuple[str, bool]:
  """Runs one rewritten command (rules 1-4): what it printed (stdout and stderr), and whether
  rule 4 stopped it (or the run line of its make recipe) at its first compile."""
  shown = f"{command.id}\n  as {how} {shlex.join(argv)}"
  if how in ("make", "bash"):
    env = _clean_env(place.tmp) if how == "bash" else None
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{shown}: exit {r.returncode}\n{r.stdout}{r.stderr}"
    printed, compiled = r.stdout + r.stderr, False
    if how == "make":  # the recipe's trainer, with the flags make gave it (rule 1)
      for line in r.stdout.splitlines():
        if line.startswith(".venv/bin/ihsweep run "):
          text, stopped = _run(command, *rewrite(_words(line), place), capfd, place)
          printed, compiled = printed + text, compiled or stopped
    return printed, compiled
  if any(a.startswith("--target=") for a in argv):
    rc = _target_plan(argv)
    assert rc in (0, COMPILING_EXIT), f"{shown}: exit {rc}"
    return "", rc == COMPILING_EXIT
  capfd.readouterr()
  try:
    rc = _in_process(how, argv)
  except Compiling:
    assert argv[0] in TRAINERS, f"{shown}: {argv[0]} reached the trainer's compile"
    return "", True
  out, err = capfd.readouterr()
  assert rc == 0, f"{shown}: exit {rc}\n{out[-2000:]}{err[-3000:]}"
  return out + err, False


@pytest.mark.parametrize("command", TO_RUN, ids=lambda c: c.id)
def test_the_command_runs(command, place, capfd):
  words = _words(command.text)
  if any("--target=" in w for w in words) and not _targets_present():
    pytest.skip("make install puts the TPU and GPU compilers in build/ (--target plans)")
  how, argv = rewrite(words, place)
  key = (how, tuple(argv))
  if key not in _DONE:  # else the same command, already run (rule 5)
    _DONE[key] = _run(command, how, argv, capfd, place)
  printed, compiled = _DONE[key]
  said = "compile" in changes(command)
  assert compiled == said, (
    f"{command.id}: {'stopped' if compiled else 'not stopped'} at its first compile, which "
    f"changes() did {'not ' if compiled else ''}foresee: its block's note would be wrong"
  )
  printed = " ".join(printed.split())
  for quoted in PRINTS.findall(command.text):
    assert quoted in printed, f"{command.id}: it does not print {quoted!r}:\n{printed[-2000:]}"


# ---------------------------------------------------------------- what the docs cite
# Every file path, module (``ihsweep.x.y``, ``analysis.x``), ``module.name`` and config field
# that README.md, docs/*.md (outside their code blocks) or a string (docstring, --help text,
# message) or comment in ihsweep/, analysis/, benchmarks/, launch/ or configs/ cites must exist:
# read from the files with ast, no module imported but the schema and analysis.outputs (neither
# imports JAX).

SOURCES = ("ihsweep", "analysis", "benchmarks", "launch", "configs")
TRACKED = set(
  subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
)
EXTENSIONS = (
  "md py sh sbatch toml txt csv json jsonl html png pdf parquet npz npy pt log safetensors bin"
).split()
# A path: words joined by "/" (a file or folder of the repository, from its root, the citing
# file's folder or a package's), or a bare file name with one of these extensions.
PATH = re.compile(
  r"(?<![\w/.$~@:-])((?:[\w.-]+/)+[\w.-]*\w|[\w-]+\.(?:md|py|sh|sbatch|toml))(?![\w/(])"
)
DOTTED = re.compile(r"(?<![\w./])((?:ihsweep|analysis)(?:\.\w+)+)")
SPAN = re.compile(r"``(.+?)``|`([^`\n]+)`")  # inline code in Markdown and in docstrings
SHORT_REF = re.compile(r"(?<![\w.])([a-z_]\w*)((?:\.[A-Za-z_]\w*)+)")
PATH_THEN_NAME = re.compile(r"([\w/]+\.py)`?\s+`?([a-z]\w*_\w+)\b")  # `x/y.py` `some_name`
# Not the repository's: the first folder of paths that a run, a build or a cluster has.
OUTSIDE = ("runs", "build", "results", "tmp", "shared", "home", "gs:", "http:", "https:")
# Words that are objects as often as modules (a run, a config, a model, a source...): a
# ``run.cells`` is load_run's table, not ihsweep/commands/run.py's.
OBJECTS = {"run", "source", "model", "cache", "grid", "loop", "train", "config", "data", "sweep"}
# Cited on purpose, not ours or not meant to exist; each with why.
NOT_OURS = {
  "model.process_weights_": "TransformerLens's HookedTransformer method",
  "train.batchsize": "the misspelt field that check_known_fields refuses (an example)",
  "cache.stack_head_results": "TransformerLens's ActivationCache method",
}


def _cited_texts():
  """``(where, text)``: each doc outside its code blocks; each string (docstrings, help texts,
  messages) and comment of the code."""
  for doc in DOCS:
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), (ROOT / doc).read_text(),
                  flags=re.S)  # fmt: skip
    yield doc, text
  for path in sorted(t for t in TRACKED if t.split("/")[0] in SOURCES):
    src = (ROOT / path).read_text()
    if path.endswith(".py"):
      for node in ast.walk(ast.parse(src)):  # docstrings, --help texts, messages
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
          yield f"{path}:{node.lineno}", node.value
      for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
          yield f"{path}:{tok.start[0]}", tok.string
    elif path.endswith((".sh", ".sbatch")):
      for n, line in enumerate(src.splitlines(), 1):
        if line.lstrip().startswith("#"):
          yield f"{path}:{n}", line


def _module_file(dotted: str) -> pathlib.Path | None:
  p = ROOT / dotted.replace(".", "/")
  for f in (p.with_suffix(".py"), p / "__init__.py"):
    if str(f.relative_to(ROOT)) in TRACKED:
      return f
  return None


def _names(body) -> dict:
  """The names a module (or class) body defines: defs, classes, assignments, imports, and
  those its module ``__getattr__`` answers (its string constants)."""
  out = {}
  for node in body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      out[node.name] = node
      if node.name == "__getattr__" and not isinstance(node, ast.ClassDef):
        out.update({c.value: None for c in ast.walk(node) if isinstance(c, ast.Constant)
                    and isinstance(c.value, str)})  # fmt: skip
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        out.update({n.id: node for n in ast.walk(target) if isinstance(n, ast.Name)})
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      out.update({(a.asname or a.name).split(".")[0]: node for a in node.names})
    elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For)):
      for part in (node.body, node.orelse, getattr(node, "finalbody", [])):
        out.update(_names(part))
      for handler in getattr(node, "handlers", []):
        out.update(_names(handler.body))
  return out


@functools.cache
def _module_names(path: pathlib.Path) -> tuple[dict, set]:
  """The module's top-level names, and every name anywhere in it that a class holds (methods,
  fields, ``self.x``) or a function defines (nested functions)."""
  tree = ast.parse(path.read_text())
  inner = set()
  for node in ast.walk(tree):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      inner.add(node.name)
      if isinstance(node, ast.ClassDef):
        inner |= set(_names(node.body))
    if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
      inner.add(node.attr)
  return _names(tree.body), inner


def _dotted_problem(dotted: str) -> str | None:
  """Why ``ihsweep.x.y[.name[.attr]]`` does not exist; None if it does."""
  parts = dotted.split(".")
  for i in range(len(parts), 0, -1):
    path = _module_file(".".join(parts[:i]))
    if path:
      break
  else:
    return f"no module {parts[0]}"
  rest = parts[i:]
  if not rest:
    return None
  names, inner = _module_names(path)
  if rest[0] not in names:
    return f"{'.'.join(parts[:i])} has no {rest[0]}"
  node = names[rest[0]]
  if len(rest) > 1 and isinstance(node, ast.ClassDef) and rest[1] not in inner:
    return f"{'.'.join(parts[: i + 1])} has no {rest[1]}"
  return None


@functools.cache
def _short_modules() -> dict:
  """A module's last name -> its dotted names (``loop`` -> ihsweep.training.loop)."""
  out = {}
  for t in TRACKED:
    if t.endswith(".py") and t.split("/")[0] in ("ihsweep", "analysis"):
      mod = t[:-3].replace("/", ".").removesuffix(".__init__")
      out.setdefault(mod.split(".")[-1], []).append(mod)
  return out


@functools.cache
def _inner_names() -> frozenset:
  """Every name a class or function of ihsweep/ and analysis/ holds (``_module_names``)."""
  return frozenset().union(*(_module_names(ROOT / t)[1] for t in TRACKED
                             if t.endswith(".py") and t.split("/")[0] in SOURCES))  # fmt: skip


@functools.cache
def _fields() -> frozenset:
  from ihsweep.base import schema

  return frozenset(f.path for f in schema.FIELDS)


def _is_field(path: str) -> bool:
  path = re.sub(r"^sweep\.(grid|zip)\.", "", path)  # an axis names a field
  return path in ("sweep.grid", "sweep.zip") or any(
    f == path or f.startswith(path + ".") for f in _fields()
  )


def _short_problem(first: str, rest: str) -> str | None:
  """Why ``first.rest`` (a module's last name, or a config section) names nothing."""
  full = f"{first}.{rest}"
  if full in NOT_OURS or rest.split(".")[0] in EXTENSIONS:
    return None
  modules = _short_modules().get(first, [])
  if any(_dotted_problem(f"{m}.{rest}") is None for m in modules):
    return None
  sections = {f.split(".")[0] for f in _fields() if "." in f}
  if first == "config" and (re.search(r"(^|\.)[A-Z]", rest) or _is_field(rest)):
    return None  # --config.X, --config.SECTION.FIELD: placeholders
  if first in sections and _is_field(full):
    return None
  if first in OBJECTS:  # an object's attribute (run.cells): any class's or function's name
    return None if rest.split(".")[0] in _inner_names() else f"no config field or name {full}"
  if modules:
    return f"{', '.join(modules)}: no {rest}"
  return None


def _path_problem(path: str, where: str) -> str | None:
  """Why a cited path is not in the repository; None if it is, or is not the repository's
  (a run directory, a placeholder such as DIR/analysis or gNNN, a report's own file)."""
  from analysis import outputs

  if any(ch in path for ch in "*<>{}…$") or "NNN" in path:
    return None
  if os.path.basename(path) in {os.path.basename(n) for n in outputs.NAMES}:
    return None  # a report's file (DIR/analysis/law.json)
  first = path.split("/")[0]
  if "/" in path and (re.search(r"(^|/)[A-Z_]{2,}(/|\.|$)", path) or first in OUTSIDE):
    return None  # a placeholder or a path outside the repository
  if path.startswith(("/", "~", ".")) and not path.startswith(".ci/"):
    return None
  if "/" not in path:
    return None if any(os.path.basename(t) == path for t in TRACKED) else f"no file {path}"
  here = os.path.dirname(where.split(":")[0])
  for base in ("", here, "ihsweep", "analysis", "docs"):
    q = os.path.normpath(os.path.join(base, path.rstrip("/")))
    if q in TRACKED or any(t.startswith(q + "/") for t in TRACKED):
      return None
  top = {t.split("/")[0] for t in TRACKED} | {t.split("/")[1] for t in TRACKED if "/" in t[8:]}
  return f"no path {path}" if first in top or first.endswith(".py") else None


def cited_problems() -> list[str]:
  """Every cited file, module or name that does not exist, with where it is cited."""
  problems = []
  for where, text in _cited_texts():
    for m in PATH.finditer(text):
      path = m.group(1).rstrip(".")
      if re.fullmatch(r"(ihsweep|analysis)(\.\w+)+", path):
        continue  # a module: DOTTED's
      why = _path_problem(path, where)
      if why:
        problems.append(f"{where}: {why}")
    for m in DOTTED.finditer(text):
      dotted = m.group(1).rstrip(".")
      if dotted.split(".")[-1] in EXTENSIONS:
        continue  # analysis.md: a file
      why = _dotted_problem(dotted)
      if why:
        problems.append(f"{where}: {dotted}: {why}")
    for m in PATH_THEN_NAME.finditer(text):
      path, name = m.groups()
      if (ROOT / path).is_file() and name not in _module_names(ROOT / path)[0]:
        problems.append(f"{where}: {path} has no {name}")
    for span in SPAN.finditer(text):
      for r in SHORT_REF.finditer(span.group(1) or span.group(2)):
        if r.group(1) in ("ihsweep", "analysis"):
          continue
        why = _short_problem(r.group(1), r.group(2)[1:])
        if why:
          problems.append(f"{where}: `{r.group(0)}`: {why}")
  return problems


def test_every_cited_file_module_and_name_exists():
  assert cited_problems() == []


def test_the_cited_names_check_finds_what_does_not_exist(monkeypatch):
  """A file, a module, a module's name, a config field and a path-and-name that do not exist,
  each found; the words around them, and what does exist, not."""
  text = (
    "See DESIGN.md and docs/nowhere.md beside docs/planning.md; `ihsweep.base.errors.Nope` "
    "and ``ihsweep.base.errors.IhsweepError``; ``metric_registry.NO_SUCH`` beside "
    "``metric_registry.HEAD_SCORES``; `train.attn_kind` beside `train.batch_size`; "
    "`ihsweep/configuration/config.py` `default_sweep`; runs/demo/analysis and DIR/x are not "
    "ours; a run.cells table."
  )
  monkeypatch.setattr(sys.modules[__name__], "_cited_texts", lambda: [("x.md", text)])
  assert cited_problems() == [
    "x.md: no file DESIGN.md",
    "x.md: no path docs/nowhere.md",
    "x.md: ihsweep.base.errors.Nope: ihsweep.base.errors has no Nope",
    "x.md: ihsweep/configuration/config.py has no default_sweep",
    "x.md: `metric_registry.NO_SUCH`: ihsweep.compute.metric_registry: no NO_SUCH",
    "x.md: `train.attn_kind`: no config field or name train.attn_kind",
  ]
