"""End-to-end: the installed ``ihsweep`` console script."""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import CPU_COMPILE_FLAGS

from ihsweep import cli
from ihsweep.commands import flags as flags_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
  "--config.model.d_model=32",
  "--config.model.n_heads=2",
  "--config.model.d_mlp=64",
  "--config.model.vocab_size=64",
  "--config.model.max_context=32",
  "--config.train.batch_size=8",
  "--config.train.context_size=32",
  "--config.train.num_steps=30",
  "--config.train.steps_per_call=10",
  "--config.train.lr=3e-3",
  "--config.ensemble.size=2",
  "--config.eval.every_steps=0",
  "--config.checkpoint.params_schedule=none",
]


def _ihsweep(*args):
  exe = shutil.which("ihsweep", path=os.path.dirname(sys.executable))
  cmd = [exe] if exe else [sys.executable, "-m", "ihsweep.cli"]
  # XLA_FLAGS without a device count, so that the CLI picks one device per core itself.
  env = {**os.environ, "XLA_FLAGS": CPU_COMPILE_FLAGS, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    cmd + list(args), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
  )


def test_train_command_writes_config_and_metrics(tmp_path):
  work = tmp_path / "run"
  r = _ihsweep(
    "train",
    "--config=configs/default.py",
    f"--workdir={work}",
    "--noprogress",
    *TINY,
    "--config.ensemble.peak_lrs=(1e-3, 3e-3)",
    "--config.eval.every_steps=15",
    "--config.eval.n_probes=10",
    "--config.eval.n_sequences=8",
  )
  assert r.returncode == 0, r.stderr
  assert "final loss per model" in r.stdout
  resolved = json.loads((work / "config.json").read_text())
  assert resolved["train"]["num_steps"] == 30
  assert resolved["ensemble"]["peak_lrs"] == [1e-3, 3e-3]
  rows = [json.loads(x) for x in (work / "train_log.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [10, 15, 25, 30]  # calls end at evaluations
  assert rows[-1]["tokens"] == 30 * 8 * 32
  assert all(len(r["loss"]) == 2 for r in rows)
  evals = [json.loads(x) for x in (work / "metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], r["cell"]) for r in evals] == [(s, c) for s in (0, 15, 30) for c in (0, 1)]
  assert evals[0]["train_loss"] is None and evals[-1]["train_loss"] > 0
  assert all(0 <= r["ps_max"] <= 1 and len(r["ps"]) == 2 and len(r["ps"][0]) == 2 for r in evals)
  assert sorted(os.listdir(work / "checkpoints" / "state")) == ["30"]


def test_bad_override_is_reported(tmp_path):
  r = _ihsweep(
    "train", "--config=configs/default.py", f"--workdir={tmp_path}/x", "--config.model.n_heads=3"
  )
  assert r.returncode == 2
  assert "config.model.n_heads = 3" in r.stderr and "divisor" in r.stderr
  assert not (tmp_path / "x").exists()


def test_usage_lists_commands():
  r = _ihsweep("--help")
  assert r.returncode == 0 and "train" in r.stdout
  r = _ihsweep("frobnicate")
  assert r.returncode == 2 and "unknown command" in r.stderr


@pytest.mark.parametrize(
  "args,words",
  [
    (
      ["--config=configs/default.py", "--config.train.lrr=1"],
      [
        "--config.train.lrr: the config has no field train.lrr; did you mean train.lr?",
        "train has: attention, b1, b2, batch_size",
      ],
    ),
    (
      ["--config=configs/default.py", "--config.trainn.lr=1"],
      ["no field trainn; did you mean train?"],
    ),
    (["--config=configs/default.py", "--config.train.lr.x=1"], ["train.lr is a float"]),
    (  # an optional field the file does not set: said so, not "did you mean model.n_heads?"
      ["--config=configs/default.py", "--config.model.ln_eps=1e-6"],
      [
        "--config.model.ln_eps: model.ln_eps is an optional field (default 1e-05) that this "
        "config file does not set",
        "(config.model.ln_eps = ... in its get_config)",
      ],
    ),
    (
      ["--config", "configs/default.py", "--config.sweep.grid.train.batch_size=(8,16)"],
      ["no field sweep.grid.train (sweep.grid has no fields)", "add an axis with --grid"],
    ),
    (
      ["--config=configs/nope.py"],
      ["ihsweep: cannot load the config: configs/nope.py: no such file\n"],
    ),
    (["--config="], ["--config= is empty"]),
    (["--config=configs/default.py:nope"], ["unknown variant 'nope'"]),
    (["--config=configs/default.py", "--config.train.batch_size=abc"], ["batch_size=abc"]),
    (["--config=configs/default.py", "stray", "words"], ["takes flags only", "'stray words'"]),
  ],
)
def test_bad_config_files_and_fields_get_one_line(tmp_path, args, words):
  r = _ihsweep("train", f"--workdir={tmp_path}/x", *args)
  assert r.returncode == 2, r.stderr
  assert r.stderr.startswith("ihsweep: ") and len(r.stderr.splitlines()) == 1, r.stderr
  assert "config_config" not in r.stderr
  for w in words:
    assert w in r.stderr
  assert not (tmp_path / "x").exists()


def test_workdir_that_is_a_file(tmp_path):
  (tmp_path / "f").write_text("")
  r = _ihsweep("train", "--config=configs/default.py", f"--workdir={tmp_path}/f")
  assert r.returncode == 2 and "is not a directory" in r.stderr


def test_train_on_local_text_files_then_prepare_hits_the_cache(tmp_path):
  from test_natural import write_corpus

  files = write_corpus(str(tmp_path / "text"))
  data = [
    "--config.data.source=natural",
    f"--config.data.files={files}",
    f"--config.data.cache_dir={tmp_path / 'cache'}",
    "--config.model.vocab_size=300",
  ]
  r = _ihsweep(
    "train",
    "--config=configs/default.py",
    f"--workdir={tmp_path / 'run'}",
    "--noprogress",
    *TINY,
    *data,
    "--config.train.num_steps=4",
    "--config.train.steps_per_call=2",
  )
  assert r.returncode == 0, r.stderr
  assert "on device, windows gathered in-graph" in r.stderr and "cache built" in r.stderr
  rows = [json.loads(x) for x in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
  assert rows[-1]["step"] == 4
  r = _ihsweep("corpus", "prepare", "--config=configs/default.py", *data)
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  assert out["cache_hit"] is True and out["train_tokens"] > 1000


def test_corpus_command_usage_and_bad_data(tmp_path):
  r = _ihsweep("corpus", "frobnicate")
  assert r.returncode == 2 and "ihsweep corpus fetch NAME" in r.stderr
  r = _ihsweep(
    "train",
    "--config=configs/default.py",
    f"--workdir={tmp_path}/x",
    "--config.data.source=natural",
    f"--config.data.files={tmp_path}/none/*.txt",
    "--config.model.vocab_size=300",
  )
  assert r.returncode == 2 and "matches no file" in r.stderr
  assert len(r.stderr.strip().splitlines()) == 1


# The flags each command (corpus: subcommand) takes, each as a user would give it, and the
# words that start each command.
OWN_FLAGS = {
  "run": ("config", "workdir", "progress", "grid", "zip"),
  "status": ("workdir",),
  "train": ("config", "workdir", "progress"),
  "corpus fetch": ("cache_dir",),
  "corpus prepare": ("config",),
  "predict": ("batch_size", "context_size", "law", "term", "json"),
  "plan": (
    "config",
    "grid",
    "zip",
    "devices",
    "devices_per_worker",
    "devices_per_host",
    "flops_per_s",
    "network",
    "law",
    "json",
    "target",
    "compare_attention",
    "workdir",
  ),
  "export": ("workdir", "cell", "step", "to", "out"),
}
FLAG_ARGS = {
  "config": "--config=configs/default.py",
  "workdir": "--workdir={tmp}/w",
  "progress": "--noprogress",
  "grid": "--grid=train.batch_size=4,8",
  "zip": "--zip=train.lr=1e-3,3e-3",
  "batch_size": "--batch_size=32",
  "context_size": "--context_size=64",
  "law": "--law={tmp}/law.json",
  "term": "--term=n_params=1e6",
  "json": "--json",
  "target": "--target=v5e:2x2",
  "compare_attention": "--compare_attention",
  "cache_dir": "--cache_dir={tmp}/cache",
  "devices": "--devices=8",
  "devices_per_worker": "--devices_per_worker=2",
  "devices_per_host": "--devices_per_host=8",
  "flops_per_s": "--flops_per_s=4e14",
  "network": "--network=v5e",
  "cell": "--cell=0",
  "step": "--step=10",
  "to": "--to=transformer_lens",
  "out": "--out={tmp}/model.pt",
}
COMMAND_WORDS = {
  "run": ["run"],
  "status": ["status"],
  "train": ["train"],
  "corpus fetch": ["corpus", "fetch", "python-docs"],
  "corpus prepare": ["corpus", "prepare"],
  "predict": ["predict"],
  "plan": ["plan"],
  "export": ["export"],
}


def test_flag_table_covers_every_flag_and_the_help():
  assert cli.COMMAND_FLAGS == OWN_FLAGS
  assert set(cli.FLAG_FORMS) == set(FLAG_ARGS) and all(f in flags_lib.FLAGS for f in FLAG_ARGS)
  for command in cli.COMMANDS:  # the help names only the command's own flags, and all of them
    own = {f for k, names in OWN_FLAGS.items() if k.split()[0] == command for f in names}
    words = re.findall(r"--[\w.]+", cli.COMMAND_HELP[command].replace("[no]", ""))
    mentioned = {flags_lib.split_args([w])[0][0][1] for w in words}
    assert mentioned == own, command


def test_help_with_a_config_shows_that_configs_values():
  r = _ihsweep("run", "--help", "--config=configs/demo.py", "--config.train.lr=0.002")
  assert r.returncode == 0, r.stderr[-2000:]
  lines = {line.split("  ")[1].split("=")[0]: line for line in r.stdout.splitlines()[1:]
           if line.startswith("  --config.")}  # fmt: skip
  assert "the value of --config=configs/demo.py is shown" in r.stdout
  assert "--config.train.lr=0.002 [default: 0.001]" in lines["--config.train.lr"]
  assert "--config.model.d_model=64 [default: 128]" in lines["--config.model.d_model"]
  assert "'anywhere' [default: 'half']" in lines["--config.data.induction_start"]
  assert "[default" not in lines["--config.model.n_layers"]  # equal to the default: once
  plain = _ihsweep("run", "--help")  # no config: the defaults, nothing loaded
  assert plain.returncode == 0 and "--config.model.d_model=128  " in plain.stdout
  assert "[default:" not in plain.stdout
  bad = _ihsweep("run", "--help", "--config=configs/demo.py", "--config.train.nope=1")
  assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, bad.stderr


@pytest.mark.parametrize("key", list(OWN_FLAGS))
def test_each_command_refuses_the_flags_of_the_others(tmp_path, capsys, key):
  own = [FLAG_ARGS[f].format(tmp=tmp_path) for f in OWN_FLAGS[key]]
  foreign = [f for f in FLAG_ARGS if f not in OWN_FLAGS[key]]
  for flag in foreign:
    arg = FLAG_ARGS[flag].format(tmp=tmp_path)
    assert cli.main(["ihsweep", *COMMAND_WORDS[key], *own, arg]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ihsweep: {arg.split('=')[0]} is not a flag of `ihsweep {key}`")
    assert len(err.splitlines()) == 1 and all(f in err for f in OWN_FLAGS[key]), err
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize(
  "args,flag,key",
  [
    (
      ["train", "--config=configs/default.py", "--workdir={tmp}/w", "--grid=train.batch_size=4,8"],
      "--grid",
      "train",
    ),
    (
      ["train", "--config=configs/default.py", "--workdir={tmp}/w", "--batch_size=32"],
      "--batch_size",
      "train",
    ),
    (
      ["predict", "--batch_size=8", "--context_size=64", "--workdir={tmp}/w"],
      "--workdir",
      "predict",
    ),
    (
      ["train", "--config", "configs/default.py", "--workdir", "{tmp}/w", "--batch_size", "32"],
      "--batch_size",
      "train",
    ),  # absl's two-word form
    (["status", "--workdir={tmp}", "--noprogress"], "--noprogress", "status"),
    (
      ["predict", "--batch_size=8", "--context_size=64", "--noconfig.train.x"],
      "--noconfig.train.x",
      "predict",
    ),
    (
      ["predict", "--batch_size=8", "--context_size=64", "--config.train.lr=1"],
      "--config.train.lr",
      "predict",
    ),
    (["run", "--flagfile={tmp}/flags", "--workdir={tmp}/w"], "--batch_size", "run"),
    (["train", "--work_dir={tmp}/w"], "--work_dir", "train"),
    (["corpus", "frobnicate", "--json"], "--json", "corpus"),
  ],
)
def test_foreign_flags_from_the_command_line(tmp_path, args, flag, key):
  (tmp_path / "flags").write_text("--config=configs/default.py\n--batch_size=32\n")
  tiny = TINY if key in ("run", "train") else []  # were the flag accepted, a short run
  r = _ihsweep(*[a.format(tmp=tmp_path) for a in args], *tiny)
  assert r.returncode == 2, r.stderr
  assert r.stderr.startswith(f"ihsweep: {flag} is not a flag of `ihsweep {key}`; ")
  assert len(r.stderr.splitlines()) == 1 and r.stdout == ""
  assert sorted(os.listdir(tmp_path)) == ["flags"]
  if flag == "--work_dir":
    assert "did you mean --workdir?" in r.stderr


def test_a_one_value_flag_given_twice_with_different_values_is_refused(tmp_path):
  for args, words in (
    (
      ["predict", "--batch_size=8", "--context_size=64", "--law=a.json", "--law=b.json"],
      "--law is given twice with different values (--law=a.json and --law=b.json)",
    ),
    (
      [
        "train",
        "--config=configs/default.py",
        f"--workdir={tmp_path / 'a'}",
        f"--workdir={tmp_path / 'b'}",
      ],
      "--workdir is given twice",
    ),
    (
      [
        "train",
        "--config=configs/default.py",
        f"--workdir={tmp_path / 'a'}",
        "--progress",
        "--noprogress",
      ],
      "--progress is given twice",
    ),
    (
      [
        "run",
        "--config=configs/default.py",
        "--config=configs/induction.py",
        f"--workdir={tmp_path / 'a'}",
      ],
      "--config is given twice",
    ),
  ):
    r = _ihsweep(*args)
    assert r.returncode == 2 and r.stderr == f"ihsweep: {r.stderr[9:]}", r.stderr
    assert words in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
  assert os.listdir(tmp_path) == []
  r = _ihsweep("predict", "--batch_size=8", "--context_size=64", "--json", "--json")
  assert r.returncode == 0, r.stderr  # the same value twice (a launcher's --noprogress, say)


def test_one_sweep_axis_set_by_both_flags_is_refused(tmp_path):
  """--grid=F=… with --config.sweep.grid.F=… (either order, or the zip section) would keep one
  silently; both flags are named instead."""
  axis, override = "--grid=train.batch_size=4,8", "--config.sweep.grid.train.batch_size=(16,)"
  for command, args in (
    ("run", [axis, override]),
    ("run", [override, axis]),
    ("plan", [override, axis]),
    ("run", ["--zip=train.batch_size=4,8", "--config.sweep.zip.train.batch_size=(16,)"]),
  ):
    workdir = [f"--workdir={tmp_path / 'w'}"] if command == "run" else ["--devices=4"]
    r = _ihsweep(command, "--config=configs/demo.py", *workdir, *args)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    flag = args[0] if args[0].startswith(("--grid", "--zip")) else args[1]
    other = args[1] if flag == args[0] else args[0]
    assert r.stderr == (
      f"ihsweep: {flag} and {other} both set the sweep axis train.batch_size: give it once "
      f"({flag.split('=')[0]} replaces the config file's axis; give all its values there)\n"
    ), r.stderr
  assert os.listdir(tmp_path) == []
  # Different axes together stay allowed.
  args = ["--config=configs/demo.py", "--workdir=w", "--grid=train.context_size=16", override]
  assert cli._check_flags("run", *flags_lib.split_args(args)) is None


def test_each_command_takes_its_own_flags(tmp_path):
  law = tmp_path / "law.json"
  law.write_text(json.dumps({"log_T": 10.0, "alpha": 0.5, "beta": 0.5}))
  r = _ihsweep("predict", "--batch_size", "4", "--context_size=25", f"--law={law}", "--json")
  assert r.returncode == 0, r.stderr
  assert json.loads(r.stdout)["updates"] == pytest.approx(2202.6, rel=1e-4)
  r = _ihsweep("predict", f"--flagfile={tmp_path / 'none'}")
  assert r.returncode == 2 and r.stderr.startswith("ihsweep: Unable to open flagfile")
  (tmp_path / "flags").write_text("--batch_size=4\n--context_size=25\n")
  r = _ihsweep("predict", f"--flagfile={tmp_path / 'flags'}", "--nojson")
  assert r.returncode == 0 and "after 46,694 updates = 4.7M tokens" in r.stdout, r.stderr
  r = _ihsweep("corpus", "fetch", "nope", "--cache_dir", str(tmp_path / "cache"))
  assert r.returncode == 2 and "unknown corpus 'nope'" in r.stderr
  r = _ihsweep("status", "--workdir", str(tmp_path))
  assert r.returncode == 2 and "is not a sweep run directory" in r.stderr
  # run: --grid and --zip reach the planner, which budgets by a law predicting < 1 update
  law.write_text(json.dumps({"log_T": -200.0, "alpha": 0.37, "beta": 0.62}))
  r = _ihsweep(
    "run",
    "--config",
    "configs/default.py",
    f"--workdir={tmp_path / 'w'}",
    "--noprogress",
    "--grid",
    "train.batch_size=4,8",
    "--zip=train.lr=1e-3,3e-3",
    "--config.sweep.budget=law",
    f"--config.sweep.law_file={law}",
  )
  assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
  assert "sweep.budget = 'law': the law (log_T = -200" in r.stderr
  assert "B = 4, C = 128" in r.stderr and "fewer than one update" in r.stderr


@pytest.mark.parametrize("workdir", ["", "{tmp}/a_file/sub", "unwritable"])
def test_train_refuses_a_workdir_it_cannot_use_before_compiling(tmp_path, workdir):
  (tmp_path / "a_file").write_text("not a directory")
  if workdir == "unwritable":
    if os.geteuid() == 0:  # root writes through file modes
      workdir = "/sys/ihsweep-unwritable-test"
      if not os.path.isdir("/sys"):
        pytest.skip("no /sys to fail a write in")
    else:
      (tmp_path / "ro").mkdir(mode=0o500)
      workdir = str(tmp_path / "ro" / "run")
  r = _ihsweep(
    "train",
    "--config=configs/default.py",
    f"--workdir={workdir.format(tmp=tmp_path)}",
    "--noprogress",
    *TINY,
  )
  assert r.returncode == 2, r.stderr
  assert r.stderr.startswith("ihsweep: ") and "workdir" in r.stderr
  assert len(r.stderr.splitlines()) == 1, r.stderr  # no log line: nothing was built or compiled
  assert sorted(os.listdir(tmp_path)) == ["a_file"] + (["ro"] if "ro" in workdir else [])


@pytest.mark.parametrize(
  "law,words",
  [
    ({"log_T": 1e308, "alpha": 0.37, "beta": 0.62}, ["log_T = 1e+308: need |log_T| <= 700"]),
    ({"log_T": 13.26, "alpha": 1e308, "beta": 0.0}, ["e^-inf updates", "fewer than one update"]),
    (
      {"log_T": 99.0, "alpha": 0.0, "beta": 0.0},
      ["9.89e+42 updates = 4.05e+46 tokens", "(T = 9.89e+42)"],
    ),
  ],
)
def test_predict_with_a_law_far_outside_any_run(tmp_path, law, words):
  (tmp_path / "law.json").write_text(json.dumps(law))
  r = _ihsweep("predict", "--batch_size=64", "--context_size=64", f"--law={tmp_path}/law.json")
  out = r.stdout + r.stderr
  assert r.returncode == (0 if r.stdout else 2), out
  assert not re.search(r"\d{16}", out.replace(",", "")), out  # no 300-digit numbers
  # the prediction, "no interval: … stores no coefficient covariance", the law
  assert len(out.splitlines()) <= 3
  for w in words:
    assert w in out


@pytest.mark.parametrize(
  "name,text,words",
  [
    ("s.py", "def get_config(:\n", ["{f} line 1: SyntaxError: invalid syntax"]),
    (
      "n.py",
      "x = 1\ndef get_config():\n  return undefined_name\n",
      ["{f} line 3: NameError: name 'undefined_name' is not defined"],
    ),
    ("z.py", "x = 1 / 0\n", ["{f} line 1: ZeroDivisionError: division by zero"]),
    (
      "o.py",
      "def get_config():\n  return open('/nonexistent/x')\n",
      ["{f} line 2: FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/x'"],
    ),
    ("t.py", "def get_config():\n  raise TypeError('no')\n", ["{f} line 2: TypeError: no"]),
    (
      "nog.py",
      "X = 1\n",
      [
        "ihsweep: {f} has no get_config() (a config file is Python defining "
        "get_config(), e.g. configs/default.py)\n"
      ],
    ),
    ("cfg.json", '{"seed": 0}\n', ["ihsweep: {f} has no get_config()"]),
  ],
)
def test_a_config_file_that_fails_to_load_gets_one_line(tmp_path, name, text, words):
  f = tmp_path / name
  f.write_text(text)
  r = _ihsweep("train", f"--config={f}", f"--workdir={tmp_path}/x")
  assert r.returncode == 2, r.stderr
  assert r.stderr.startswith("ihsweep: ") and len(r.stderr.splitlines()) == 1, r.stderr
  assert "config_config" not in r.stderr and "Traceback" not in r.stderr
  for w in words:
    assert w.format(f=f) in r.stderr, r.stderr
  assert not (tmp_path / "x").exists()


def test_an_unknown_field_set_in_a_config_file_is_refused(tmp_path):
  f = tmp_path / "typo.py"
  f.write_text(
    f"import sys\nsys.path.insert(0, {ROOT!r})\nfrom configs import default\n\n"
    f"def get_config():\n  c = default.get_config('tiny')\n  c.train.batchsize = 32\n"
    f"  return c\n"
  )
  r = _ihsweep("train", f"--config={f}", f"--workdir={tmp_path}/x")
  assert r.returncode == 2, r.stderr
  assert r.stderr.startswith(
    "ihsweep: invalid config: config.train.batchsize = 32 is not "
    "allowed: no such field; did you mean train.batch_size?"
  ), r.stderr
  assert len(r.stderr.splitlines()) == 1 and not (tmp_path / "x").exists()


def _ihsweep_home(home, cwd, *args):
  """``ihsweep`` run in ``cwd`` with HOME = ``home``."""
  env = {
    **os.environ,
    "HOME": str(home),
    "XLA_FLAGS": CPU_COMPILE_FLAGS,
    "JAX_PLATFORMS": "cpu",
  }
  return subprocess.run(
    [sys.executable, "-m", "ihsweep.cli", *args],
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )


def test_a_workdir_under_home_is_expanded(tmp_path):
  (tmp_path / "cwd").mkdir()
  mine = tmp_path / "mine"
  mine.mkdir()
  (mine / "notes.txt").write_text("my own")
  r = _ihsweep_home(
    tmp_path,
    tmp_path / "cwd",
    "train",
    f"--config={ROOT}/configs/default.py",
    "--workdir=~/mine",
    "--noprogress",
    *TINY,
  )
  assert r.returncode == 2, r.stderr
  assert r.stderr.startswith(f"ihsweep: --workdir={mine} is not allowed: "), r.stderr
  r = _ihsweep_home(tmp_path, tmp_path / "cwd", "status", "--workdir=~/mine")
  assert r.returncode == 2 and f"{mine} is not a sweep run directory" in r.stderr, r.stderr
  assert os.listdir(tmp_path / "cwd") == []  # no literal ./~


def _fake_runs(tmp_path):
  """A sweep with one group directory, and a train run, as their markers make them."""
  from ihsweep.runs import ownership

  runs = {"sweep": tmp_path / "sweep", "train": tmp_path / "train"}
  for kind, d in runs.items():
    ownership.claim_workdir(str(d), kind)
  group = runs["sweep"] / "groups" / "g000"
  group.mkdir(parents=True)
  (group / "status.json").write_text('{"state": "running"}')
  return runs["sweep"], group, runs["train"]


def test_a_sweeps_group_directory_is_refused_naming_the_sweep(tmp_path):
  sweep_dir, group, _ = _fake_runs(tmp_path)
  expected = (
    f"ihsweep: --workdir={group} is group g000 of the sweep in {sweep_dir}: resume it "
    f"with `ihsweep run --workdir={sweep_dir}`\n"
  )
  for command in ("train", "run"):
    r = _ihsweep(
      command, "--config=configs/default.py", f"--workdir={group}", "--noprogress", *TINY
    )
    assert r.returncode == 2 and r.stderr == expected, r.stderr
  r = _ihsweep("status", f"--workdir={group}")
  assert r.returncode == 2 and r.stderr == (
    f"ihsweep: --workdir={group} is group g000 of the sweep in {sweep_dir}: its status is in "
    f"`ihsweep status --workdir={sweep_dir}`\n"
  ), r.stderr
  assert sorted(os.listdir(group)) == ["status.json"]


def test_status_of_a_train_run_says_where_its_progress_is(tmp_path):
  _, _, train_dir = _fake_runs(tmp_path)
  r = _ihsweep("status", f"--workdir={train_dir}")
  assert r.returncode == 2 and r.stderr == (
    f"ihsweep: --workdir={train_dir} holds an ihsweep train run, not a sweep: its progress is "
    f"in train_log.jsonl and metrics.jsonl (python -m analysis report {train_dir} reads it)\n"
  ), r.stderr


def test_out_of_device_memory_is_one_line_and_exits_at_once(tmp_path, monkeypatch, capsys):
  """A model or batch too large for the device (seen with C = 65,536: a 17.7 TB allocation)
  raised a JAX traceback, then hung ~5 min in orbax's threads; now one line and exit 1."""
  from ihsweep.training import runner

  def too_big(*args, **kwargs):
    raise RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 17677012668608 bytes.")

  monkeypatch.setattr(runner, "fit", too_big)
  from ihsweep.commands import common

  monkeypatch.setattr(common.os, "_exit", lambda code: (_ for _ in ()).throw(SystemExit(code)))
  with pytest.raises(SystemExit) as exit_:
    cli.main(
      [
        "ihsweep",
        "train",
        "--config=configs/default.py:tiny",
        f"--workdir={tmp_path / 'w'}",
        "--noprogress",
      ]
    )
  assert exit_.value.code == 1
  err = [line for line in capsys.readouterr().err.splitlines() if " INFO " not in line]
  assert err == [
    "ihsweep: out of device memory (RESOURCE_EXHAUSTED: Out of memory allocating "
    "17677012668608 bytes.); lower train.batch_size, train.context_size, the model "
    "size or eval.n_probes (the run directory keeps its last complete checkpoint: "
    "rerun to resume)"
  ]


def test_plan_command_predicts_without_training(tmp_path):
  # study scale (C4, absent here) from a given FLOP/s: two groups on 4 workers of 2 devices
  r = _ihsweep(
    "plan",
    "--config=configs/exp1_natural.py",
    "--devices=8",
    "--devices_per_worker=2",
    "--flops_per_s=1e14",
    "--grid=train.batch_size=8,16",
    "--grid=train.context_size=64",
    "--json",
  )
  assert r.returncode == 0, r.stderr
  p = json.loads(r.stdout)
  assert sorted(g["batch_size"] for g in p["groups"]) == [8, 16]  # 1B tokens each: equal cost
  assert p["groups"][0]["cost_flops"] == pytest.approx(p["groups"][1]["cost_flops"])
  assert (p["n_workers"], p["devices_per_worker"]) == (4, 2)
  assert [(s["worker"], s["start_s"]) for s in p["schedule"]] == [(0, 0), (1, 0)]
  assert p["utilisation"] == pytest.approx(2 / 4, rel=0.01)  # 2 of 4 workers busy, equal work
  r = _ihsweep(
    "plan",
    "--config=configs/exp1_natural.py",
    "--devices=6",
    "--devices_per_worker=4",
    "--flops_per_s=1e14",
  )
  assert r.returncode == 2 and r.stderr.startswith(
    "ihsweep: --devices_per_worker=4 is not allowed: a divisor of --devices=6 (1, 2, 3, 6)"
  )


# ---- issue 37: refused at once, before anything is created or compiled ----


def test_numbers_past_what_the_programs_hold_are_refused_before_the_run_directory(tmp_path):
  cases = [
    (
      ["--config.train.batch_size=2000000000"],
      "config.train.batch_size = 2000000000 is not allowed: at most 16,777,215 at "
      "train.context_size = 128",
    ),
    (
      [
        "--config.train.batch_size=200000000",
        "--config.train.context_size=8",
        "--config.train.gradient_accumulation_steps=3",
      ],
      "a divisor of train.batch_size = 200000000: one of 1, 2, 4, 5, 8, 10",
    ),
    (
      ["--config.model.d_model=2000000000", "--config.model.n_heads=3"],
      "(110 in all)",
    ),
    (
      ["--config.sweep.budget=law", "--config.sweep.law_multiple=1e40"],
      "config.sweep.law_multiple = 1e+40 is not allowed: a multiple that keeps every cell within "
      "2,147,483,647 updates",
    ),
    (
      ["--config.train.batch_size=10000000", "--config.train.context_size=16"],
      "cannot fit its devices at any memory setting: its models' train state and one update's "
      "tokens alone need",
    ),
  ]
  for i, (flags, words) in enumerate(cases):
    work = tmp_path / f"w{i}"
    env = {"IHSWEEP_DEVICE_MEMORY": "1e9"}  # 2 models of 680 MB of tokens each per device
    r = _ihsweep_env(env, "run", "--config=configs/default.py", f"--workdir={work}", *flags)
    assert r.returncode == 2 and words in r.stderr, (flags, r.stderr[-2000:])
    assert len(r.stderr.strip().splitlines()) == 1 and not work.exists(), r.stderr


def _ihsweep_env(extra, *args):
  exe = shutil.which("ihsweep", path=os.path.dirname(sys.executable))
  cmd = [exe] if exe else [sys.executable, "-m", "ihsweep.cli"]
  env = {**os.environ, "XLA_FLAGS": CPU_COMPILE_FLAGS, "JAX_PLATFORMS": "cpu"}
  return subprocess.run(
    cmd + list(args), cwd=ROOT, env={**env, **extra}, capture_output=True, text=True, timeout=300
  )


def test_plan_on_a_billion_devices_answers(tmp_path):
  """It looped over every worker before (no answer after 60 s)."""
  r = _ihsweep("plan", "--config=configs/demo.py", "--devices=1000000000", "--flops_per_s=4e14")
  assert r.returncode == 0, r.stderr[-2000:]
  assert "the sweep (1 phase(s): 500000000 × 2)" in r.stdout  # auto: workers of 2 per host


def test_an_override_the_sweep_axes_would_ignore_is_refused(tmp_path):
  for value in ("-4", "12"):
    r = _ihsweep(
      "run", "--config=configs/demo.py", f"--config.train.batch_size={value}",
      f"--workdir={tmp_path / 'w'}",
    )  # fmt: skip
    assert r.returncode == 2 and not (tmp_path / "w").exists()
    assert r.stderr == (
      f"ihsweep: --config.train.batch_size={value} would be ignored: the sweep's axis "
      "sweep.grid.train.batch_size = (8, 16, 32) sets it for every cell; change the axis "
      "instead (--config.sweep.grid.train.batch_size='(V1, V2)', or "
      "--grid=train.batch_size=V1,V2)\n"
    )


def test_a_config_returning_none_and_a_config_outside_the_checkout(tmp_path):
  (tmp_path / "none.py").write_text("def get_config():\n  return None\n")
  r = _ihsweep("train", f"--config={tmp_path / 'none.py'}", f"--workdir={tmp_path / 'w'}")
  assert r.returncode == 2 and not (tmp_path / "w").exists()
  assert r.stderr.splitlines()[-1] == (
    f"ihsweep: cannot load the config: {tmp_path / 'none.py'}: get_config() returned None (it "
    "must return the config, a ml_collections.ConfigDict)"
  )
  # `from configs import default` in a config file elsewhere: the checkout's configs
  (tmp_path / "mine.py").write_text(
    "from configs import default\n\ndef get_config():\n  return default.get_config()\n"
  )
  r = _ihsweep("plan", f"--config={tmp_path / 'mine.py'}", "--devices=2", "--flops_per_s=1e12")
  assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize(
  "b,c,words",
  [
    (1, 1, ["B = 1 is outside the law's fitted range: fitted on B 8–128; 1 is 8× below",
            "C = 1 is outside the law's fitted range: fitted on C 64–1024; 1 is 64× below"]),
    (100000, 100000, ["B = 100000 is outside", "C = 100000 is outside"]),
    (32, 256, []),
  ],
)  # fmt: skip
def test_predict_with_the_study_law_warns_outside_its_grid(b, c, words):
  r = _ihsweep("predict", f"--batch_size={b}", f"--context_size={c}", "--json")
  assert r.returncode == 0, r.stderr
  warnings = json.loads(r.stdout)["warnings"]
  assert len(warnings) == len(words) and all(w in " ".join(warnings) for w in words), warnings
  assert r.stderr.count("ihsweep: warning:") == len(words)


FITTED_LAW = {  # a law as `python -m analysis fit-law` writes it, with its intervals
  "log_T": 9.65,
  "alpha": 1.07,
  "beta": -0.17,
  "sigma": 0.22,
  "cov": {
    "names": ["log_T", "alpha", "beta"],
    "matrix": [[0.82, 0.11, 0.15], [0.11, 0.026, 0.011], [0.15, 0.011, 0.034]],
    "t_dof": 8,
  },
}


def test_help_status_and_predict_import_no_jax(tmp_path):
  """``ihsweep --help``, ``run --help``, ``status`` and ``predict`` with a fitted law's
  intervals read files only: none imports JAX or the training stack (seconds of start-up each
  on a loaded machine: benchmarks/startup.py). One process makes the four calls in turn."""
  sweep = tmp_path / "sweep"
  (sweep / "groups" / "g000").mkdir(parents=True)
  (sweep / "cells.csv").write_text(
    "cell,group,seed,batch_size,context_size,budget_updates\n0,g000,0,8,32,30\n1,g000,1,8,32,30\n"
  )
  # every cell listed: status rebuilds nothing from the config (which would need JAX)
  (sweep / "groups" / "g000" / "config.json").write_text('{"ensemble": {"size": 2}}')
  (tmp_path / "law.json").write_text(json.dumps(FITTED_LAW))
  calls = [
    ["--help"],
    ["run", "--help"],
    ["status", f"--workdir={sweep}"],
    ["predict", "--batch_size=8", "--context_size=64", f"--law={tmp_path / 'law.json'}"],
  ]
  heavy = ("jax", "jaxlib", "flax", "optax", "orbax", "tensorflow", "torch")
  code = (
    "import sys\nfrom ihsweep import cli\n"
    f"for argv in {calls!r}:\n  assert cli.main(['ihsweep', *argv]) == 0, argv\n"
    f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(heavy)!r}))"
  )
  r = subprocess.run(
    [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
  )
  assert r.returncode == 0, r.stderr
  assert r.stdout.splitlines()[-1] == "[]", r.stdout  # none of them imported
  assert re.search(r"^g000 +pending +2 +8 +32 +0/30 ", r.stdout, re.M), r.stdout
  assert "95% prediction interval for one cell (sigma = 0.22)" in r.stdout, r.stdout


@pytest.mark.parametrize(
  "fields,words",
  [
    (
      {"ci": {}, "ci_note": "2 residual degree(s) of freedom (fewer than 3): a bootstrap ..."},
      "{f} stores no coefficient covariance ('cov'): its fit gave no intervals: 2 residual "
      "degree(s) of freedom (fewer than 3): a bootstrap ...",
    ),
    (
      {},
      "{f} stores no coefficient covariance ('cov') and no reason ('ci_note'): a law written by "
      "hand or by an ihsweep before laws stored intervals (`python -m analysis fit-law` and the "
      "report store one or the other)",
    ),
  ],
)
def test_predict_says_why_a_law_gives_no_interval(tmp_path, capsys, fields, words):
  """A fitted law without intervals names its fit's reason (``ci_note``: too few cells, grid
  points or resamples), not the version that wrote it."""
  path = tmp_path / "law.json"
  path.write_text(json.dumps({"log_T": 9.65, "alpha": 1.07, "beta": -0.17, **fields}))
  argv = ["ihsweep", "predict", "--batch_size=8", "--context_size=64", f"--law={path}"]
  flags_lib.FLAGS.unparse_flags()  # in one process, absl keeps an earlier call's values
  try:
    assert cli.main(argv) == 0
  finally:
    flags_lib.FLAGS.unparse_flags()
  out = capsys.readouterr().out.splitlines()
  assert out[1] == "  no interval: " + words.format(f=path), out


TERMS_LAW = {  # a law as `python -m analysis fit-law --terms=data.frequency,data.reliability`
  "log_T": 9.65,  # writes it: + gamma[X] ln X for each term
  "alpha": 1.07,
  "beta": -0.17,
  "terms": ["data.frequency", "data.reliability"],
  "gammas": {"data.frequency": 0.5, "data.reliability": -0.3},
}


def test_predict_with_a_law_with_terms_takes_each_terms_value(tmp_path, capsys):
  """A law fitted with terms beyond B and C predicts exp(x·coef), x = (1, −ln B, −ln C, ln x_k,
  ...), with each term's value from --term=COLUMN=VALUE; a term missing, one the law does not
  have, a value that is no number or not positive: one line, exit 2."""
  path = tmp_path / "law.json"
  path.write_text(json.dumps(TERMS_LAW))

  def predict(*args, law=f"--law={path}"):
    argv = ["ihsweep", "predict", "--batch_size=8", "--context_size=64", law, *args]
    flags_lib.FLAGS.unparse_flags()  # in one process, absl keeps an earlier call's values
    try:
      code = cli.main([a for a in argv if a])
    finally:
      flags_lib.FLAGS.unparse_flags()
    out = capsys.readouterr()
    return code, out.out, out.err

  terms = ("--term=data.frequency=0.8", "--term=data.reliability=0.9")
  x = (1.0, -math.log(8), -math.log(64), math.log(0.8), math.log(0.9))
  coef = (9.65, 1.07, -0.17, 0.5, -0.3)
  updates = math.exp(sum(a * b for a, b in zip(x, coef)))
  code, out, err = predict(*terms, "--json")
  assert code == 0, err
  got = json.loads(out)
  assert got["updates"] == pytest.approx(updates, rel=1e-12)
  assert got["terms"] == {"data.frequency": 0.8, "data.reliability": 0.9}
  assert got["law"]["gammas"] == TERMS_LAW["gammas"]
  code, out, err = predict(*terms)
  assert code == 0, err
  assert out.splitlines()[0].startswith(
    f"B = 8, C = 64, data.frequency = 0.8, data.reliability = 0.9: induction heads predicted "
    f"after {updates:,.0f} updates"
  ), out
  assert "· data.frequency^0.5 · data.reliability^-0.3, ln T = 9.65" in out, out
  for args, words in (
    (terms[:1], f"the law in {path} also depends on data.reliability (fit-law --terms): give "
     "--term=data.reliability=VALUE"),
    ((*terms, "--term=n_params=1e6"), f"--term=n_params=1e+06: the law in {path} has no term in "
     "n_params (its terms: data.frequency, data.reliability)"),
    (("--term=data.frequency=-0.5", terms[1]), "data.frequency = -0.5: the law needs a positive "
     "finite number"),
    (("--term=data.frequency", terms[1]), "--term=data.frequency: expected COLUMN=NUMBER, e.g. "
     "--term=data.frequency=0.8"),
    ((*terms, "--term=data.frequency=0.7"), "--term data.frequency is given twice (0.8 and 0.7): "
     "give it once"),
  ):  # fmt: skip
    assert predict(*args) == (2, "", f"ihsweep: {words}\n"), args
  code, out, err = predict("--term=data.frequency=0.8", law="")
  assert (code, err) == (
    2,
    "ihsweep: --term=data.frequency=0.8: the study's law has no term in data.frequency (it "
    "takes B and C only)\n",
  )


def test_a_closed_pipe_ends_quietly():
  """`ihsweep ... | head`: exit 141 (128 + SIGPIPE), no BrokenPipeError traceback. The reader
  (`true`) closes the pipe before the command, still starting, writes."""
  for cmd in ("-m ihsweep.cli plan --help", "-m ihsweep.cli --help"):
    script = f'{sys.executable} {cmd} | true; echo "rc=${{PIPESTATUS[0]}}" >&2'
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
    assert "rc=141" in r.stderr, r.stderr


def test_status_help_names_every_group_state():
  """Issue 58: status's description and --help named done, running, pending, failed (and
  interrupted) but not 'stopped', a state it prints (a running group whose worker is gone)."""
  from ihsweep.commands import status

  for state in ("done", "running", "stopped", "pending", "failed", "interrupted"):
    assert state in status.DESCRIPTION and state in status.ABOUT, state
  assert "stopped (running, but its worker is gone" in " ".join(status.ABOUT.split())
