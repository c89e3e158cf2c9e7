"""The flags of the ``ihsweep`` commands, each defined once: its absl definition with its help
string (the words every command's ``--help`` prints for it) and ``FORMS``, the flag as users
type it. A command module names the flags it takes; ``check`` refuses the others before
anything is parsed or loaded, ``help_text`` writes a command's ``--help`` from them.

No JAX here: ``ihsweep --help`` imports this module.
"""

from __future__ import annotations

import difflib
import os
import re
import textwrap

from absl import flags
from ml_collections import config_flags

from ihsweep.base.law import STUDY

FLAGS = flags.FLAGS
ARGV: list[str] = []  # the command line --config.X overrides are read from (cli.main sets it)

config_flags.DEFINE_config_file(
  "config",
  None,
  "an ml_collections config file with get_config(), e.g. configs/default.py; FILE:VARIANT "
  "passes VARIANT (configs/default.py: tiny, python_docs, or both comma-separated: "
  "configs/default.py:tiny,python_docs); --config.SECTION.FIELD=VALUE overrides any field "
  "(docs/configuration.md, configs/default.py, ihsweep/data/__init__.py default_config)",
  lock_config=True,
  sys_argv=ARGV,
)
flags.DEFINE_string(
  "workdir",
  None,
  "run directory (run, train: created if missing; status, export: read; plan: the one its "
  "launch lines name)",
)
flags.DEFINE_bool("progress", True, "progress bar (default on; --noprogress turns it off)")
flags.DEFINE_integer("batch_size", None, "batch size B (sequences per update)")
flags.DEFINE_integer("context_size", None, "context size C (tokens per sequence)")
flags.DEFINE_string(
  "law",
  None,
  'an emergence law JSON {"log_T": ..., "alpha": ..., "beta": ...} (or "T" for log_T; other '
  'keys ignored; e.g. from ihsweep fit-law; a law with "terms" beyond B and C predicts only '
  "with each term's value, which predict takes). "
  f"predict: default the study's ln T = {STUDY['log_T']}, alpha = {STUDY['alpha']}, "
  f"beta = {STUDY['beta']}; a law from fit-law "
  "also gives 95% intervals and warns outside the B and C it was fitted on. plan: where an "
  "'emergence' budget stops each group (default: the sweep's law, which puts most stops at "
  "the cap)",
)
flags.DEFINE_multi_string(
  "grid",
  [],
  "a sweep axis (repeatable; adds to or replaces the config's sweep.grid), e.g. "
  "--grid=train.batch_size=8,16",
)
flags.DEFINE_multi_string("zip", [], "an axis of values varied together with the other --zip axes")
flags.DEFINE_multi_string(
  "term",
  [],
  "predict: the value of one of the law's terms beyond B and C (its law.json's \"terms\", "
  "from fit-law; the law gains + gamma[COLUMN] ln VALUE), e.g. --term=data.frequency=0.8; "
  "one per term",
)
flags.DEFINE_bool(
  "json",
  False,
  "one JSON object. predict: batch_size, context_size, terms, updates, tokens, interval, "
  "prediction_interval, warnings, law; plan: groups, phases, schedule, makespan_s, "
  "utilisation, layouts (each with refused and best)",
)
flags.DEFINE_string(
  "target",
  None,
  "compile every group for this accelerator without it: a TPU topology (v4, v5e, v5p or v6e: "
  "e.g. v4:4x4x4, v5e:8x8) or, with --devices=N, a GPU: h100-80gb, h200-141gb, a100-80gb, "
  "l40s-48gb",
)
flags.DEFINE_bool(
  "compare_attention",
  False,
  "plan --target: compile each group whose train step uses a fused attention kernel once "
  "more with the explicit attention pattern, to show the bytes it saves (no decision of the "
  "plan depends on it)",
)
flags.DEFINE_integer(
  "devices", None, "the sweep's devices (any count: this machine need not have them)"
)
flags.DEFINE_integer(
  "devices_per_worker",
  None,
  "one phase of workers of D devices: a divisor of a host's devices (one process each) or, "
  "with --flops_per_s, a multiple of them (workers spanning hosts); default: the phases "
  "chosen from the groups' costs (measured: this machine's devices, one worker)",
)
flags.DEFINE_integer(
  "devices_per_host",
  None,
  "with --flops_per_s: the devices of one process (a host; default 8)",
)
flags.DEFINE_float(
  "flops_per_s",
  None,
  "sustained FLOP/s per device (an H100 at 40% MFU in bf16: 4e14): time = cost / (m · F) + "
  "updates × the gradient all-reduce over its data axis, no start-up; without it a few "
  "groups are compiled and timed here (about 20 s each on a CPU)",
)
flags.DEFINE_string(
  "network",
  None,
  "with --flops_per_s: the interconnect, per device each way: h100 (default; NVLink 450 GB/s "
  "in a host, InfiniBand 50 GB/s across), h200 (the same), a100 (NVLink 300, InfiniBand 25), "
  "l40s (PCIe 32), v4 (ICI 268.6 per chip), v5e (ICI 200), v5p (ICI 600), v6e (ICI 400), "
  "none (no communication); 60 s per phase switch (assumed) unless none",
)
flags.DEFINE_string(
  "cache_dir",
  None,
  "fetch: the cache (default $IHSWEEP_CACHE or ~/.cache/ihsweep); training and prepare read "
  "config.data.cache_dir",
)
flags.DEFINE_integer("cell", None, "the model (cell id) to export")
flags.DEFINE_integer("step", None, "the saved update to export (default: the last)")
flags.DEFINE_string(
  "to",
  None,
  "transformer_lens: one file (torch.save: cfg, state_dict); open it with "
  "ihsweep.runs.export.load_transformer_lens(PATH), or "
  'HookedTransformer(blob["cfg"]).load_state_dict(blob["state_dict"]). Every ihsweep '
  "architecture (learned or rotary positions, MLPs or attention-only, tied or untied "
  "embeddings). hf: a save_pretrained directory: GPT2LMHeadModel.from_pretrained(PATH); "
  "learned positions with MLPs only (GPT-2 has no rotary positions and an MLP in every block)",
)
flags.DEFINE_string(
  "out",
  None,
  "the new file (transformer_lens) or directory (hf); default under DIR/analysis",
)

FORMS = {
  "config": "--config=FILE[:VARIANT] --config.SECTION.FIELD=VALUE",
  "workdir": "--workdir=DIR",
  "progress": "--[no]progress",
  "grid": "--grid=FIELD=V1,V2,...",
  "zip": "--zip=FIELD=V1,V2,...",
  "batch_size": "--batch_size=B",
  "context_size": "--context_size=C",
  "law": "--law=FILE",
  "term": "--term=COLUMN=VALUE",
  "json": "--[no]json",
  "target": "--target=NAME",
  "cache_dir": "--cache_dir=DIR",
  "devices": "--devices=N",
  "devices_per_worker": "--devices_per_worker=D",
  "devices_per_host": "--devices_per_host=H",
  "flops_per_s": "--flops_per_s=F",
  "network": "--network=h100|h200|a100|l40s|v4|v5e|v5p|v6e|none",
  "compare_attention": "--[no]compare_attention",
  "cell": "--cell=N",
  "step": "--step=S",
  "to": "--to=transformer_lens|hf",
  "out": "--out=PATH",
}


def flag_list(command_flags: dict[str, tuple[str, ...]], key: str) -> str:
  """The flags of a command (``run``) or subcommand (``corpus fetch``) as the user types them;
  ``corpus``: those of each subcommand (``command_flags``: key → flag names)."""
  return "; ".join(
    (k[len(key) + 1 :] + ": " if k != key else "") + ", ".join(FORMS[name] for name in names)
    for k, names in command_flags.items()
    if k == key or k.startswith(key + " ")
  )


def help_text(usage: str, about: str, names) -> str:
  """A command's ``--help``: its usage and description, then each flag it takes (``names``,
  in order) with its form and the help string it was defined with."""
  lines = [usage.rstrip(), "", textwrap.indent(about.strip("\n"), "  "), ""]
  for name in names:
    form = FORMS[name].split(" ")[0]
    text = re.sub(r";\s*repeat this option to specify a list of values$", "", FLAGS[name].help)
    wrapped = textwrap.wrap(text, 98 - 26, break_on_hyphens=False)
    if len(form) > 23:
      lines += [f"  {form}"] + [" " * 26 + w for w in wrapped]
    else:
      lines += [f"  {form:23s} {wrapped[0]}"] + [" " * 26 + w for w in wrapped[1:]]
  return "\n".join(lines)


def split_args(args):
  """``(flags, positional)`` of the words after the command (``--flagfile`` expanded), read as
  absl reads them: flags as ``(name as typed, flag it sets, value or None)``, e.g.
  ``("noprogress", "progress", None)``, ``("config.train.lr", "config", "3e-4")``; a
  non-boolean flag without ``=`` takes the next word as its value (``--workdir DIR``)."""
  found, positional, i = [], [], 0
  while i < len(args):
    arg, i = args[i], i + 1
    if arg == "--":
      positional += args[i:]
      break
    m = re.fullmatch(r"--?([A-Za-z_][\w.-]*)(?:=(.*))?", arg, re.S)
    if not m:
      positional.append(arg)
      continue
    name, value = m.groups()
    flag = name.split(".", 1)[0]
    if (
      flag not in FLAGS
      and flag.startswith("no")
      and flag[2:] in FLAGS
      and (FLAGS[flag[2:]].boolean or "." in name)
    ):  # --noprogress, --noconfig.a.b
      flag = flag[2:]
    elif value is None and "." not in name and flag in FLAGS and not FLAGS[flag].boolean:
      value, i = (args[i], i + 1) if i < len(args) else (None, i)
    found.append((name, flag, value))
  return found, positional


def config_arg(found) -> str:
  """The value of the last --config flag in ``found`` (``split_args``); '' if none."""
  values = [value for name, flag, value in found if flag == "config" and "." not in name]
  return (values[-1] or "") if values else ""


def check(command: str, found, positional, command_flags) -> str | None:
  """Why the flags ``found`` (``split_args``) do not suit ``command`` (``command_flags``: the
  flags of each command and subcommand): the first flag it does not take, with its flags; a
  flag that takes one value given twice with different values; a --grid/--zip axis also set
  by a --config.sweep override; or a --config file that does not exist. None when they suit."""
  key = f"{command} {positional[0]}" if positional else command
  key = key if key in command_flags else command
  allowed = sum((v for k, v in command_flags.items() if k == key or k.startswith(key + " ")), ())
  for name, flag, _ in found:
    if flag not in allowed:
      close = difflib.get_close_matches(flag, allowed, n=1)
      hint = f"did you mean --{close[0]}? " if close and close[0] != flag else ""
      return (
        f"--{name} is not a flag of `ihsweep {key}`; {hint}its flags: "
        f"{flag_list(command_flags, key)}"
      )
  problem = _given_twice(found) or _axis_given_twice(found)
  if problem:
    return problem
  path = config_arg(found).split(":", 1)[0]
  if path == "" and any(flag == "config" and "." not in name for name, flag, _ in found):
    return "--config= is empty: give a config file, e.g. --config=configs/default.py"
  if path and not os.path.exists(path):
    return f"cannot load the config: {path}: no such file"
  return None


def _given_twice(found) -> str | None:
  """A one-value flag given twice with different values (absl keeps the last silently);
  ``--grid``/``--zip``/``--term`` are repeatable, and a later ``--config.X`` overrides an
  earlier one."""
  given = {}
  for name, flag, value in found:
    if flag in ("grid", "zip", "term") or "." in name:
      continue
    typed = f"--{name}" + (f"={value}" if value is not None else "")
    if given.setdefault(flag, typed) != typed:
      return (
        f"--{flag} is given twice with different values ({given[flag]} and {typed}): give it once"
      )
  return None


def _axis_given_twice(found) -> str | None:
  """A sweep axis set both by --grid/--zip and by a --config.sweep.grid/zip override."""
  axis_flags = {}  # field → the --grid/--zip flag that sets it
  for name, flag, value in found:
    if flag in ("grid", "zip") and value and "=" in value:
      axis_flags.setdefault(value.split("=", 1)[0].strip(), (flag, f"--{flag}={value}"))
  for name, flag, value in found:
    parts = name.split(".", 3)
    if flag == "config" and len(parts) == 4 and parts[1:3] in (["sweep", "grid"], ["sweep", "zip"]):
      if parts[3] in axis_flags:
        axis_flag, typed = axis_flags[parts[3]]
        return (
          f"{typed} and --{name}" + (f"={value}" if value is not None else "") + " both set "
          f"the sweep axis {parts[3]}: give it once "
          f"(--{axis_flag} replaces the config file's axis; give all its values there)"
        )
  return None
