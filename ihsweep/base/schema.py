"""The run config's schema: one entry per field (default, type, allowed range or choices, unit,
one line of help), from which come the sections' defaults (``configs/default.py``,
``fields.default_eval`` …, ``data.default_config``), the simple checks
(``ihsweep.configuration.fields.check``: type, range, choices; cross-field rules are code in
``ihsweep.configuration``), ``help_text`` (a command's --help) and the reference in
docs/configuration.md:

  python -m ihsweep.base.schema --markdown           # print the generated reference
  python -m ihsweep.base.schema --markdown --write   # rewrite it in docs/configuration.md

A leaf module: it imports nothing of ihsweep, and ml_collections only when building defaults, so
``import ihsweep.base.schema`` stays cheap (no JAX). A bound written as a string (``hi =
"model.max_context"``) depends on other fields: the validator passes its value.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any

INT32_MAX = 2**31 - 1  # seeds and the update counter are int32 on the device


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field. ``path``: 'section.name' ('seed' at the top level); ``kind``: 'int',
  'float', 'bool', 'str', 'choice', 'tuple' (of per-model values) or 'section' (a sub-section;
  ``free``: its keys are not fixed). ``lo``/``hi``: the range of an int or float (a string: a
  bound set by other fields, passed by the validator), open ends per ``lo_open``/``hi_open``;
  ``hint``: words the range error appends; ``in_defaults``: False for a field the sections'
  defaults leave out (its default then comes from the dataclass that reads it)."""

  path: str
  default: Any
  kind: str
  help: str
  lo: float | str | None = None
  hi: float | str | None = None
  lo_open: bool = False
  hi_open: bool = True
  choices: tuple | None = None
  unit: str = ""
  hint: str = ""
  in_defaults: bool = True
  free: bool = False

  @property
  def section(self) -> str:
    return self.path.rpartition(".")[0]

  @property
  def name(self) -> str:
    return self.path.rpartition(".")[2]

  def allowed(self) -> str:
    """What is allowed, in words (for the reference and --help)."""
    if self.choices:
      return " | ".join(map(repr, self.choices))
    if self.kind == "bool":
      return "True | False"
    if self.kind in ("int", "float") and (self.lo is not None or self.hi is not None):
      if self.hi is None or (self.hi == math.inf and self.kind == "int"):
        return f"{'>' if self.lo_open else '>='} {self.lo}"
      left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
      if self.kind == "int":
        left, right = "[", "]"
      return f"{left}{self.lo}, {self.hi}{right}"
    return ""


def _f(path, default, help, **kw) -> Field:
  if "kind" not in kw:
    if "choices" in kw:
      kw["kind"] = "choice"
    else:
      kinds = {
        bool: "bool",
        int: "int",
        float: "float",
        str: "str",
        tuple: "tuple",
        dict: "section",
      }
      kw["kind"] = kinds[type(default)]
  return Field(path, default, help=help, **kw)


SECTIONS = {
  "": "the top level of the config",
  "model": "architecture of every model of an ensemble (ihsweep.compute.model.ModelConfig)",
  "train": "optimisation, shared by the ensemble (ihsweep.compute.train.TrainConfig); memory "
  "choices give the same numbers either way (docs/planning.md)",
  "ensemble": "the models trained together",
  "data": "the training data (ihsweep.data); a field the chosen source does not read "
  "(ihsweep.data.READS) must keep its default",
  "data.synthetic": "targets of the optimised transition matrix (data.transitions 'synthetic' "
  "or 'iid'; ihsweep.data.synthetic.SyntheticSpec)",
  "mesh": "devices",
  "eval": "online evaluation (ihsweep.compute.metrics, ihsweep.data.probes)",
  "checkpoint": "parameter checkpoints and full-state checkpoints for resume "
  "(ihsweep.runs.checkpoint)",
  "sweep": "what `ihsweep run` trains: grid, budget, placement (ihsweep.workers.sweep)",
  "log": "optional live metric writers beside the JSONL record (ihsweep.training.sinks); execution "
  "fields: they never block a resume",
}

# One entry per field, kept compact by hand (under 100 columns).
# fmt: off
FIELDS: tuple[Field, ...] = (
  _f("seed", 0,
    "model i of the ensemble uses seed + i (split into init and data streams)",
    lo=0, hi=INT32_MAX, hint=" (seeds are int32)"),
  # model
  _f("model.n_layers", 2, "transformer blocks", lo=1),
  _f("model.n_heads", 4, "attention heads per block; must divide model.d_model", lo=1),
  _f("model.d_model", 128, "residual stream width", lo=1),
  _f("model.d_mlp", 512,
    "MLP hidden width; 0 = attention-only", lo=0, hint=" (0 = attention-only)"),
  _f("model.vocab_size", 4096, "token ids are in [0, vocab_size)", lo=2),
  _f("model.max_context", 128, "longest sequence the model accepts", lo=1, unit="tokens"),
  _f("model.pos_encoding", "learned",
    "GPT-2 learned absolute positions or RoPE", choices=("learned", "rotary")),
  _f("model.tie_embeddings", True, "unembedding = token embedding transposed (GPT-2)"),
  _f("model.dtype", "auto",
    "compute dtype of matmuls (auto = bfloat16 on GPU/TPU, float32 on CPU)",
    choices=("float32", "bfloat16", "auto")),
  _f("model.param_dtype", "float32",
    "storage dtype of parameters", choices=("float32", "bfloat16")),
  _f("model.rotary_base", 10000.0, "RoPE frequency base (optional)", in_defaults=False),
  _f("model.ln_eps", 1e-5, "LayerNorm epsilon (optional; GPT-2: 1e-5)", in_defaults=False),
  # train
  _f("train.batch_size", 16, "B, sequences per update", lo=1, unit="sequences"),
  _f("train.context_size", 128,
    "C, tokens per sequence", lo=1, hi="model.max_context", unit="tokens"),
  _f("train.num_steps", 200,
    "updates; the schedule's horizon unless train.schedule_steps says otherwise",
    lo=1, hi=INT32_MAX, unit="updates", hint=" (updates; the update counter is int32)"),
  _f("train.schedule_steps", 0,
    "the learning-rate schedule's horizon (its warmup fraction and decay span it); 0 ="
    " train.num_steps; more than train.num_steps: training stops before the schedule ends",
    lo=0, hi=INT32_MAX, unit="updates", hint=" (0 = train.num_steps)"),
  _f("train.steps_per_call", 50,
    "most updates per host call (one compiled device loop)", lo=1, unit="updates"),
  _f("train.lr", 1e-3,
    "peak learning rate (per model: ensemble.peak_lrs)", lo=0.0, hi=math.inf, lo_open=True),
  _f("train.schedule", "cosine",
    "learning-rate schedule after the warmup", choices=("cosine", "constant", "inverse_sqrt")),
  _f("train.warmup_frac", 0.01,
    "linear warmup over this fraction of train.num_steps", lo=0.0, hi=1.0),
  _f("train.b1", 0.9, "AdamW beta 1", lo=0.0, hi=1.0),
  _f("train.b2", 0.999, "AdamW beta 2", lo=0.0, hi=1.0),
  _f("train.eps", 1e-8, "AdamW epsilon", lo=0.0, hi=math.inf, lo_open=True),
  _f("train.weight_decay", 0.0, "decoupled, on matrices only", lo=0.0, hi=math.inf),
  _f("train.grad_clip", 1.0, "global-norm gradient clip; 0 = none", lo=0.0, hi=math.inf),
  _f("train.gradient_accumulation_steps", 0,
    "k microbatches of B/k per update; 0 = chosen by device memory", lo=0, hi="train.batch_size"),
  _f("train.remat", "auto",
    "rematerialise block activations; auto = chosen by device memory",
    choices=("auto", "none", "blocks")),
  _f("train.attention", "auto",
    "the train step's attention: the explicit [B·H, C, C] pattern, or jax.nn.dot_product_attention"
    " (xla, or cudnn: flash attention, GPU only); auto = cudnn on a GPU where it applies, xla on"
    " TPUs, else explicit (evaluation and the metrics always read the explicit pattern)",
    choices=("auto", "explicit", "xla", "cudnn")),
  # ensemble
  _f("ensemble.size", 4, "E, models trained together", lo=1),
  _f("ensemble.peak_lrs", (), "per-model peak learning rates (empty = train.lr for all)"),
  _f("ensemble.seeds", (), "per-model seeds (empty = seed + i; a sweep fills them)"),
  _f("ensemble.cell_ids", (), "per-model ids in the logs (empty = 0 … E-1; a sweep fills them)"),
  _f("ensemble.vmap_chunk", 0,
    "models vmapped together per device (0 = auto: all on GPU/TPU, cache-sized on CPU)",
    lo=0, hint=" (0 = auto)"),
  # data
  _f("data.source", "markov_chain",
    "the data source", choices=("uniform", "markov_chain", "repeated_blocks", "natural", "markov")),
  _f("data.n_successors", 4, "markov_chain: successors per token", lo=1, hi="model.vocab_size"),
  _f("data.chain_seed", 0, "markov_chain: the chain's seed", lo=0),
  _f("data.block_min", 4,
    "repeated_blocks: shortest block", lo=1, hi="(C + 1) // 2", unit="tokens"),
  _f("data.block_max", 0,
    "repeated_blocks: longest block (0 = (C + 1) // 2)",
    lo=0, hi="(C + 1) // 2", unit="tokens", hint=" (0 = (C + 1) // 2)"),
  _f("data.transitions", "bigram",
    "markov: the transition matrix: the corpus's bigrams, optimised to data.synthetic, its "
    "marginal i.i.d., or data.matrix_file",
    choices=("bigram", "synthetic", "iid", "file")),
  _f("data.matrix_file", "", "markov, transitions 'file': a [V, V] .npy transition matrix"),
  _f("data.frequency", 0.5,
    "markov: induction-pattern frequency knob", lo=0.0, hi=1.0, hi_open=False),
  _f("data.reliability", 0.5,
    "markov: induction-pattern reliability knob", lo=0.0, hi=1.0, hi_open=False),
  _f("data.induction_start", "half",
    "markov: patterns in the second half of each sequence, or from a point drawn per sequence",
    choices=("half", "anywhere")),
  _f("data.frequencies", (), "markov: per-model frequencies (empty = data.frequency for all)"),
  _f("data.reliabilities", (), "markov: per-model reliabilities (empty = data.reliability)"),
  _f("data.smoothing", 1e-6,
    "markov, bigram: add-smoothing of the bigram rows", lo=0.0, hi=math.inf),
  _f("data.tokenizer_vocab", 0,
    "markov, bigram: the BPE's types (0 = 2 · model.vocab_size)",
    lo=0, hint=" (0 = 2 · model.vocab_size)"),
  _f("data.synthetic", {}, "markov, transitions 'synthetic' / 'iid': the matrix's targets"),
  _f("data.synthetic.marginal", "zipf",
    "target stationary distribution", choices=("uniform", "gaussian", "zipf")),
  _f("data.synthetic.categoriality", "high",
    "within-group similarity target: within_high, within_low or off",
    choices=("high", "low", "none")),
  _f("data.synthetic.n_groups", 50, "token groups (categories)", lo=1),
  _f("data.synthetic.entropy_rate_bits", 6.2, "target entropy rate; 0 = i.i.d.", unit="bits/token"),
  _f("data.synthetic.within_high", 0.4, "within-group similarity for categoriality 'high'"),
  _f("data.synthetic.within_low", 0.1, "within-group similarity for categoriality 'low'"),
  _f("data.synthetic.across", 0.1, "across-group similarity target"),
  _f("data.synthetic.weight_marginal", 10.0, "loss weight of the marginal term"),
  _f("data.synthetic.weight_entropy", 1.0, "loss weight of the entropy-rate term"),
  _f("data.synthetic.weight_row_max", 0.1, "loss weight of the row-maximum term"),
  _f("data.synthetic.weight_categoriality", 100.0, "loss weight of the categoriality term"),
  _f("data.synthetic.lr", 0.1, "optimiser learning rate", lo=0.0, hi=math.inf, lo_open=True),
  _f("data.synthetic.iterations", 5000, "optimiser steps", lo=1),
  _f("data.synthetic.power_iterations", 10,
    "power iterations for the stationary distribution", lo=1),
  _f("data.synthetic.seed", 0, "the optimisation's seed"),
  _f("data.synthetic.tol_marginal_kl", 0.02, "tolerance: KL of the achieved marginal"),
  _f("data.synthetic.tol_entropy_bits", 0.1, "tolerance: entropy rate", unit="bits"),
  _f("data.synthetic.tol_similarity", 0.03, "tolerance: group similarities"),
  _f("data.corpus", "", "natural text: a named corpus ('python-docs'; ihsweep corpus fetch)"),
  _f("data.files", "",
    "natural text: comma-separated globs of .txt/.md/.rst/.html/.jsonl/.parquet"),
  _f("data.tfds_name", "", "natural text: a TFDS dataset (e.g. 'c4/en')"),
  _f("data.tfds_split", "train", "natural text: the TFDS split"),
  _f("data.tfds_data_dir", "", "natural text: the TFDS data directory"),
  _f("data.tfds_download", False, "natural text: let TFDS download and prepare the dataset"),
  _f("data.text_field", "text", "natural text: the jsonl/parquet/TFDS field holding the text"),
  _f("data.max_documents", 0,
    "natural text: a random sample of that many documents (0 = all)", lo=0, hint=" (0 = all)"),
  _f("data.sample_seed", 0, "natural text: the seed of that sample", lo=0),
  _f("data.tokenizer", "bpe",
    "natural text: 'bpe' (a byte-level BPE trained to the vocabulary) or a tokenizer.json path"),
  _f("data.val_fraction", 0.01, "natural text: fraction of documents held out", lo=0.0, hi=1.0),
  _f("data.split_seed", 0, "natural text: the seed of the validation split", lo=0),
  _f("data.cache_dir", "", "token and matrix cache ('' = $IHSWEEP_CACHE or ~/.cache/ihsweep)"),
  _f("data.loader", "auto",
    "natural text: tokens on device, on the host, or auto = on device if within "
    "data.device_budget_mb",
    choices=("auto", "device", "host")),
  _f("data.device_budget_mb", 1024.0,
    "natural text: device memory the tokens may use", lo=0.0, hi=math.inf, unit="MiB per device"),
  # mesh
  _f("mesh.num_devices", 0,
    "devices of the mesh (0 = as many as the ensemble can use)", lo=0, hi="available devices"),
  # eval
  _f("eval.every_steps", 100,
    "updates between evaluations (0 = none; the end is always evaluated)",
    lo=0, unit="updates", hint=" (0 = no online evaluation)"),
  _f("eval.every_tokens", 0,
    "the same in tokens per model (overrides every_steps when > 0)",
    lo=0, unit="tokens", hint=" (0 = use eval.every_steps)"),
  _f("eval.n_probes", 100, "repeated-token probes (the study: 100)", lo=1, hi=100_000),
  _f("eval.probe_len", 0,
    "probe block length L (0 = min(50, C/2))", lo=0, hi="C // 2", unit="tokens"),
  _f("eval.probe_position", "start",
    "where the two blocks sit: the whole input, second block at C/2, or the last 2L positions",
    choices=("start", "middle", "end")),
  _f("eval.probe_top_k", 0,
    "draw probe ids from the K most frequent training tokens (0 = all)",
    lo=0, hint=" (0 = the whole vocabulary)"),
  _f("eval.probe_seed", 0, "the probes' seed (shared by all models and runs)", lo=0),
  _f("eval.n_sequences", 32,
    "held-out sequences per model (validation loss, ICL score)", lo=1, hi=100_000),
  _f("eval.icl_early", 0,
    "early position of the ICL score (0 = C/10)", lo=0, hi="C - 1", hint=" (0 = C/10)"),
  _f("eval.icl_late", 0,
    "late position of the ICL score (0 = C - 1)", lo=0, hi="C - 1", hint=" (0 = C - 1)"),
  # checkpoint
  _f("checkpoint.params_schedule", "log",
    "parameter checkpoints: log-spaced, the study's token schedule, or start and end only",
    choices=("log", "study", "none")),
  _f("checkpoint.points_per_octave", 2, "log schedule: points per octave", lo=1, hi=64),
  _f("checkpoint.law_window", 4.0,
    "extra points within this factor of the law's prediction", lo=1.0, hi=math.inf),
  _f("checkpoint.law_points_per_octave", 8,
    "points per octave within law_window (0 = none)", lo=0, hi=64, hint=" (0 = no extra density)"),
  _f("checkpoint.law_file", "", "a fitted law JSON ('' = the study's law)"),
  _f("checkpoint.state_every_steps", 0,
    "updates between full-state checkpoints (0 = none by count)",
    lo=0, unit="updates", hint=" (0 = none by count)"),
  _f("checkpoint.state_every_minutes", 15.0,
    "wall-clock time between full-state checkpoints (0 = none by time)",
    lo=0.0, hi=math.inf, unit="minutes"),
  _f("checkpoint.keep_state", 2, "full-state checkpoints kept", lo=1),
  _f("checkpoint.async_save", True, "write checkpoints in the background"),
  # sweep
  _f("sweep.grid", {},
    "axes: config fields whose leaves are tuples of values (their product)", free=True),
  _f("sweep.zip", {}, "axes whose tuples, of one length, vary together", free=True),
  _f("sweep.seeds", 0,
    "models per grid point (0 = ensemble.size)", lo=0, hint=" (0 = ensemble.size)"),
  _f("sweep.budget", "updates",
    "updates per cell: train.num_steps, sweep.tokens, a multiple of the law's prediction, or that"
    " with an early stop",
    choices=("updates", "tokens", "law", "emergence")),
  _f("sweep.tokens", 0,
    "budget 'tokens': tokens per model",
    lo=1, unit="tokens", hint=" (tokens per model for budget 'tokens')"),
  _f("sweep.schedule_horizon", "budget",
    "what each cell's learning-rate schedule spans (train.schedule_steps): its budget's updates"
    " (or a train.schedule_steps you set), or ceil(sweep.tokens / (B·C)), the experiment's token"
    " budget, also when an early-stopping budget ('law', 'emergence') ends training sooner (the"
    " stop is only a stop)",
    choices=("budget", "tokens")),
  _f("sweep.law_multiple", 3.0,
    "budget 'law' / 'emergence': multiple of the predicted updates",
    lo=0.0, hi=math.inf, lo_open=True),
  _f("sweep.law_file", "", "a fitted law JSON ('' = the study's law)"),
  _f("sweep.stop_metric", "ps_max",
    "budget 'emergence': the online metric that stops a group (ihsweep.compute.metric_registry)"),
  _f("sweep.stop_threshold", 0.4,
    "budget 'emergence': the level every model must reach (range: the metric's stop rule)"),
  _f("sweep.stop_margin", 2.0,
    "budget 'emergence': train on to this multiple of that update", lo=1.0, hi=math.inf),
  _f("sweep.placement", "worker",
    "each process is a worker taking groups onto its devices (the one placement)",
    choices=("worker",)),
  _f("sweep.wait_to_take_over", True, "an idle worker waits to take over a dead worker's groups"),
  _f("sweep.processes_per_worker", 0,
    "processes per worker in a jax.distributed job (0 = phases chosen from the groups' costs)",
    lo=0, hi="jax.process_count()"),
  _f("sweep.devices_per_worker", 0,
    "devices per worker inside a process: its devices split into workers of this many, "
    "training groups side by side (0 = auto: the layout the plan finds fastest for the groups' "
    "costs; the process's device count = one worker over all of them)",
    lo=0, hi="the process's devices"),
  # log
  _f("log.tensorboard", False, "TensorBoard event files in the run directory (tensorboardX)"),
  _f("log.wandb", False, "a Weights & Biases run per run directory (wandb)"),
  _f("log.wandb_project", "ihsweep", "the W&B project"),
  _f("log.wandb_mode", "offline",
    "offline (upload with wandb sync) or online", choices=("offline", "online")),
)
# fmt: on
_BY_PATH = {f.path: f for f in FIELDS}
SECTION_ORDER = ("model", "train", "ensemble", "data", "mesh", "eval", "checkpoint", "sweep", "log")
_ORDER = ("", *SECTION_ORDER[:4], "data.synthetic", *SECTION_ORDER[4:])  # of the reference


def field(path: str) -> Field:
  """The schema entry of ``path`` ('train.lr'); KeyError for an unknown one."""
  return _BY_PATH[path]


def fields(section: str) -> tuple[Field, ...]:
  """The entries directly in ``section`` ('' = top level), in order."""
  return tuple(f for f in FIELDS if f.section == section)


def choices(path: str) -> tuple:
  """The allowed values of a choice field."""
  return field(path).choices


def names(section: str) -> tuple[str, ...] | None:
  """The field names ``section`` may hold (the section names and ``seed`` for ''); None for a
  section whose keys are free or that is unknown."""
  if section == "":
    return ("seed", *SECTION_ORDER)
  f = _BY_PATH.get(section)
  if (f is None and section not in SECTIONS) or (f is not None and f.free):
    return None
  return tuple(f.name for f in fields(section))


def defaults(section: str):
  """A ``ml_collections.ConfigDict`` of ``section``'s fields at their defaults, in schema order
  (fields with ``in_defaults`` False left out)."""
  import ml_collections

  out = {}
  for f in fields(section):
    if f.in_defaults:
      out[f.name] = defaults(f.path) if f.kind == "section" else f.default
  return ml_collections.ConfigDict(out)


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def _default_text(f: Field) -> str:
  if f.kind == "section":
    return "(section)" if not f.free else "{}"
  return repr(f.default)


# A field the defaults leave out: --config.FIELD=… overrides only fields the config file has.
NOT_IN_DEFAULTS = (
  " — not in configs/default.py, so `--config.{path}=…` is refused (an optional field the config "
  "file does not set): set it in a config file (`config.{path} = …` in its get_config)"
)


def reference_markdown() -> str:
  """The configuration reference: one table per section, generated from ``FIELDS``."""
  out = []
  for section in _ORDER:
    title = f"`{section}`" if section else "top level"
    out += [f"### {title}", "", SECTIONS[section][0].upper() + SECTIONS[section][1:] + ".", ""]
    out += ["| field | default | allowed | unit | help |", "|---|---|---|---|---|"]
    for f in fields(section):
      allowed = f.allowed() or f.kind
      help_ = f.help + ("" if f.in_defaults else NOT_IN_DEFAULTS.format(path=f.path))
      row = (f"`{f.path}`", f"`{_default_text(f)}`", allowed, f.unit, help_)
      out.append("| " + " | ".join(_cell(c) for c in row) + " |")
    out.append("")
  return "\n".join(out).rstrip("\n") + "\n"


_MISSING = object()


def _lookup(config, path: str):
  """The value at ``path`` ('train.lr') of a ConfigDict or dict, or ``_MISSING``."""
  value = config
  for part in path.split("."):
    if not hasattr(value, "keys") or part not in value.keys():
      return _MISSING
    value = value[part]
  return value


def help_text(sections=None, config=None) -> str:
  """Plain text for a command's --help: every field of ``sections`` (names such as 'train';
  '' = the top level; a section brings its sub-sections; default: all), one line each under a
  line per section: the flag with its value, the help, what is allowed and the unit. The value
  is the default, or with ``config`` (a loaded config file) that config's value, followed by
  ``[default: …]`` where the two differ."""
  chosen = [s for s in _ORDER if sections is None or s in sections or s.split(".")[0] in sections]
  lines = []
  for section in chosen:
    lines.append(f"{section or 'top level'}: {SECTIONS[section]}")
    for f in fields(section):
      extra = "; ".join(x for x in (f.allowed() and f"allowed: {f.allowed()}", f.unit) if x)
      shown = _default_text(f)
      value = _MISSING if config is None or f.kind == "section" else _lookup(config, f.path)
      if value is not _MISSING and value != f.default:
        shown = f"{value!r} [default: {shown}]"
      lines.append(f"  --config.{f.path}={shown}  {f.help}" + (f" ({extra})" if extra else ""))
  return "\n".join(lines) + "\n"


BEGIN = (
  "<!-- generated by ihsweep.base.schema: do not edit; "
  "python -m ihsweep.base.schema --markdown --write -->"
)
END = "<!-- end generated -->"
DOC = os.path.join(
  os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
  "docs",
  "configuration.md",
)


def generated_part(text: str) -> str:
  """The text between ``BEGIN`` and ``END`` in a document (ValueError if the markers are not
  there)."""
  start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
  return text[start:end].strip("\n") + "\n"


def write_reference(path: str = DOC) -> None:
  """Replaces the generated part of ``path`` with ``reference_markdown()``."""
  with open(path) as f:
    text = f.read()
  start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
  with open(path, "w") as f:
    f.write(text[:start] + "\n" + reference_markdown() + text[end:])


def main(argv=None) -> int:
  import argparse

  parser = argparse.ArgumentParser(
    prog="python -m ihsweep.base.schema", description=__doc__.split("\n")[0]
  )
  parser.add_argument("--markdown", action="store_true", help="the reference as markdown tables")
  parser.add_argument("--write", action="store_true", help=f"rewrite its part of {DOC}")
  parser.add_argument("--section", action="append", help="plain-text help of these sections")
  args = parser.parse_args(argv)
  if args.markdown and args.write:
    write_reference()
  elif args.markdown:
    sys.stdout.write(reference_markdown())
  else:
    sys.stdout.write(help_text(args.section))
  return 0


if __name__ == "__main__":
  sys.exit(main())
