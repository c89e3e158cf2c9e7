"""ihsweep.base.schema: the one declaration of the config's fields agrees with the code
that reads them, stays cheap to import, and the reference in docs/configuration.md is the generated
one."""

import dataclasses
import os
import subprocess
import sys

from ihsweep.base import schema


def test_fields_are_those_the_dataclasses_read():
  from ihsweep.compute.model import ModelConfig
  from ihsweep.compute.train import TrainConfig
  from ihsweep.data.synthetic import SyntheticSpec

  assert set(schema.names("model")) == {f.name for f in dataclasses.fields(ModelConfig)}
  assert set(schema.names("train")) == {f.name for f in dataclasses.fields(TrainConfig)}
  spec = {f.name: f.default for f in dataclasses.fields(SyntheticSpec) if f.name != "vocab_size"}
  assert schema.defaults("data.synthetic").to_dict() == spec
  assert list(schema.names("data.synthetic")) == list(spec)


def test_choices_are_those_the_modules_accept():
  from ihsweep.compute import model, schedule, train
  from ihsweep.data import markov, probes, synthetic

  assert schema.choices("model.pos_encoding") == model.POS_ENCODINGS
  assert schema.choices("model.dtype") == model.DTYPES
  assert schema.choices("train.remat") == train.REMAT
  assert schema.choices("train.attention") == train.ATTENTION
  assert schema.choices("checkpoint.params_schedule") == schedule.PARAMS_SCHEDULES
  assert schema.choices("eval.probe_position") == probes.POSITIONS
  assert schema.choices("data.induction_start") == markov.INDUCTION_STARTS
  assert schema.choices("data.synthetic.marginal") == synthetic.MARGINALS
  assert schema.choices("data.synthetic.categoriality") == synthetic.CATEGORIALITY


def test_every_field_has_help_and_a_well_formed_entry():
  assert len({f.path for f in schema.FIELDS}) == len(schema.FIELDS)
  for f in schema.FIELDS:
    assert f.help and "\n" not in f.help, f.path
    assert f.section in schema.SECTIONS, f.path
    if f.choices:
      assert f.default in f.choices, f.path


def test_schema_imports_nothing_heavy():
  code = (
    "import sys, ihsweep, ihsweep.base.schema as s; "
    "s.help_text(); s.reference_markdown(); "
    "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'numpy', 'pandas')))"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
  # Every command's --help too (the commands import what they run inside their main).
  code = (
    "import contextlib, io, sys, ihsweep.cli as c\n"
    "for name in c.COMMANDS:\n"
    "  with contextlib.redirect_stdout(io.StringIO()):\n"
    "    assert c.main(['ihsweep', name, '--help']) == 0\n"
    "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'numpy', 'pandas')))"
  )
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"


def test_help_text_lists_the_chosen_sections():
  text = schema.help_text(["train"])
  assert "--config.train.lr=0.001" in text and "peak learning rate" in text
  assert "model.n_layers" not in text
  assert "--config.data.synthetic.marginal=" in schema.help_text(["data"])  # with its sub-section
  assert all(f"--config.{f.path}=" in schema.help_text() for f in schema.FIELDS)
  # the --help of each command that takes a config lists every field, from the schema
  import contextlib
  import io

  from ihsweep import cli

  for command, listed in (("run", True), ("train", True), ("plan", True), ("status", False)):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      assert cli.main(["ihsweep", command, "--help"]) == 0
    assert (schema.help_text() in out.getvalue()) == listed, command


def test_the_reference_in_docs_is_the_generated_one():
  with open(schema.DOC) as f:
    text = f.read()
  assert schema.generated_part(text) == schema.reference_markdown(), (
    f"{os.path.relpath(schema.DOC)}'s generated reference is stale: regenerate it with "
    "`python -m ihsweep.base.schema --markdown --write`"
  )


def test_the_compute_dataclasses_take_their_defaults_from_the_schema():
  """One place for defaults (issue 46): every field of TrainConfig and ModelConfig is a schema
  field of its section and defaults to the schema's value."""
  from ihsweep.compute.model import ModelConfig
  from ihsweep.compute.train import TrainConfig

  for cls, section in ((TrainConfig, "train"), (ModelConfig, "model")):
    for f in dataclasses.fields(cls):
      assert f.default == schema.field(f"{section}.{f.name}").default, (cls.__name__, f.name)
      assert type(f.default) is type(schema.field(f"{section}.{f.name}").default), f.name
