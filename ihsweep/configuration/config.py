"""Validation of run configs, done before anything is compiled.

Every check raises ``ConfigError`` naming the field, the value it got and what is allowed, so a bad
override on the command line costs a second, not a compilation.
"""

from __future__ import annotations

import functools
import math
import os
from numbers import Integral, Real

import jax

from ihsweep import data, numbers
from ihsweep.configuration import schema
from ihsweep.data import TRANSITIONS, bigram_corpus_tokens, natural, synthetic
from ihsweep.data.probes import MAX_BLOCK, MIN_BLOCK, MIN_BLOCK_REASON, block_length, probe_layout
from ihsweep.errors import IhsweepError
from ihsweep.planning.law import Law, LawError
from ihsweep.training import metric_registry
from ihsweep.training.metrics import icl_positions
from ihsweep.training.model import ModelConfig, cudnn_attention_problem
from ihsweep.workers.sharding import MeshError, mesh_shape, usable_devices

# Fields that change how a run executes but not the models it trains (the same batches and
# updates; results equal up to float rounding): a sweep axis over one would train copies.
EXECUTION_FIELDS = (
  "train.steps_per_call",
  "train.gradient_accumulation_steps",
  "train.remat",
  "train.attention",
  "ensemble.vmap_chunk",
  "mesh.num_devices",
  "checkpoint.async_save",
  "checkpoint.state_every_steps",
  "checkpoint.state_every_minutes",
  "checkpoint.keep_state",
  "data.cache_dir",
  "data.loader",
  "data.device_budget_mb",
  "sweep.placement",
  "sweep.wait_to_take_over",
  "sweep.processes_per_worker",
  "log.tensorboard",
  "log.wandb",
  "log.wandb_project",
  "log.wandb_mode",
)


def default_eval():
  """The ``eval`` section (online evaluation, ``ihsweep.training.metrics`` /
  ``ihsweep.data.probes``).

  every_steps: updates between evaluations (0 = none); every_tokens: the same in tokens per
    model (overrides every_steps when > 0). The end of training is always evaluated.
  n_probes: repeated-token probes (the study: 100); probe_len: block length L (0 = min(50, C/2));
    probe_position: where the two blocks sit, 'start' (the whole input is the 2L block tokens,
    as in the study), 'middle' (the second block starts at position C/2, after C/2 − L random
    filler ids) or 'end' (the last 2L of C positions, after C − 2L filler ids): with a fixed
    probe_len, 'middle' and 'end' measure every C at the same place relative to its context,
    so the C effect is not the probe's; probe_top_k: draw probe ids from the K
    most frequent training tokens (0 = whole vocabulary, as in the study); probe_seed: the
    probes' seed (shared by all models and runs).
  n_sequences: held-out sequences per model (validation loss, ICL score, data-drawn
    associative recall).
  icl_early / icl_late: positions of the ICL score (0 = C/10 and C − 1).
  """
  return schema.defaults("eval")


def default_checkpoint():
  """The ``checkpoint`` section (``ihsweep.runs.checkpoint``).

  params_schedule: 'log' (log-spaced, points_per_octave, plus law_points_per_octave points per
    octave within a factor law_window of the law's predicted transition), 'study' (the study's
    token schedule) or 'none' (start and end only); law_file: a fitted law JSON ('' = the
    study's law).
  state_every_minutes: wall-clock minutes between full-state checkpoints for resume (taken at
    the first host call that ends after them; 0 = none by time); state_every_steps: updates
    between them (0 = none by count); either way also at the end and on a stop. keep_state:
    how many to keep; async_save: write in the background. By time, not by update count: an
    accelerator runs 500 small updates in seconds, so a count that suits one cell makes disk
    I/O set the pace of another (levanter's checkpointer saves by time too).
  """
  return schema.defaults("checkpoint")


def default_sweep():
  """The ``sweep`` section: what ``ihsweep run`` trains (``ihsweep.workers.sweep``).

  grid: config fields as nested sections whose leaves are tuples of values; the grid points
    are their product, e.g. ``grid.train.batch_size = (8, 16)`` and ``grid.train.context_size
    = (32, 64)`` give 4 points. zip: the same layout, tuples of one common length that vary
    together (one axis of the product). seeds: models per grid point, with seeds ``seed, seed
    + 1, …`` (0 = ensemble.size). A cell is one model: a grid point and a seed.
  budget (updates per cell): 'updates' = train.num_steps; 'tokens' = ``tokens`` per model,
    rounded up to whole updates; 'law' = ``law_multiple`` × the emergence law's predicted
    updates for the cell's B and C (``law_file``, '' = the study's law); 'emergence' = at most
    law_multiple × the prediction, stopping a group early once every model's online
    ``stop_metric`` has reached ``stop_threshold`` and training has gone on to ``stop_margin``
    × the update at which it did (diverged models count as done). The threshold must lie above
    the untrained level: for ps_max, above the score of uniform attention on the probes
    (refused before compiling); a model already past it at update 0 is warned about and counts
    only once it has been seen below it (``runner.EmergenceStop``).
  placement (how groups meet devices; ``ihsweep.workers.sweep``): 'worker' = every ``ihsweep run``
    process on the run directory is a worker taking groups one at a time onto its own local
    devices (several processes, or the processes of one jax.distributed job, train groups side
    by side; a worker spanning several processes trains a group on all their devices:
    processes_per_worker). wait_to_take_over: a worker with nothing left to take waits while
    other workers hold groups, to take over any whose worker dies (False: it exits; a rerun
    takes over). processes_per_worker (inside one jax.distributed job of several processes;
    'worker' placement): 0 = phases chosen from the groups' costs
    (``placement.plan_phases``): in each phase the processes form workers of a size the
    phase's groups fill (1: process-local groups; several: a worker spanning hosts trains a
    group on all their devices; all: one global mesh); k = one phase, workers of k
    consecutive processes.
  """
  return schema.defaults("sweep")


def default_log():
  """The ``log`` section (optional; absent = JSONL only): live metric writers beside the record,
  ``metrics.jsonl`` and ``train_log.jsonl`` (``ihsweep.training.sinks``: one scalar per cell and
  metric, tagged ``cell_{id}/{metric}``, step = updates). Execution fields: they never block a
  resume.

  tensorboard: TensorBoard event files in each run directory's ``tensorboard/`` (needs
    tensorboardX: ``pip install 'ihsweep[logging]'``). wandb: a Weights & Biases run per run
    directory (needs wandb), in project wandb_project; wandb_mode: 'offline' (files under the
    run directory's ``wandb/``; upload with ``wandb sync``) or 'online'.
  """
  return schema.defaults("log")


class ConfigError(IhsweepError, ValueError):
  """A config field has a value that is not allowed."""

  def __init__(self, field: str, value, allowed: str):
    self.field, self.value, self.allowed = field, value, allowed
    super().__init__(f"config.{field} = {value!r} is not allowed: {allowed}")


class WorkdirError(ConfigError):
  """The ``--workdir`` flag (a flag, not a config field: ``field`` "workdir") names a directory
  that cannot hold the run. The message reads "--workdir=DIR is not allowed: {allowed}", or
  ``message`` if given."""

  def __init__(self, workdir: str, allowed: str, message: str | None = None):
    super().__init__("workdir", workdir, allowed)
    self.args = (message or f"--workdir={workdir} is not allowed: {allowed}",)

  def __str__(self) -> str:
    return self.args[0]


INT32_MAX = schema.INT32_MAX  # seeds and the update counter are int32 on the device


def section_fields(section: str) -> tuple[str, ...] | None:
  """The fields a run config's ``section`` may have (``seed`` and the section names for
  ``"config"``; ``data.synthetic`` for that sub-section); None for a section whose keys are
  free (``sweep.grid``, ``sweep.zip``: axes named by field paths) or unknown."""
  names = schema.names("" if section == "config" else section)
  return None if names is None else tuple(sorted(names))


def _check_known_fields(cfg, section: str = "config") -> None:
  """Refuses a key no code reads (a typo such as ``train.batchsize``, which would otherwise be
  ignored and stored in config.json), naming it, the section's fields and the closest one."""
  import difflib

  fields = section_fields(section)
  if fields is None:
    return
  parent = "" if section == "config" else f"{section}."
  for key in cfg.keys():
    if key not in fields:
      close = difflib.get_close_matches(key, fields, n=1)
      hint = f"; did you mean {parent}{close[0]}?" if close else ""
      raise ConfigError(
        parent + key,
        cfg[key],
        f"no such field{hint} ({parent[:-1] or 'the config'} has: {', '.join(fields)})",
      )
    if hasattr(cfg[key], "keys"):
      _check_known_fields(cfg[key], parent + key)


_UNSET = object()


def _check(cfg, path: str, value=_UNSET, *, lo=None, hi=None, hint: str | None = None):
  """The schema's simple check of the field ``path`` ('train.lr'): its kind and its range or
  choices (``ihsweep.configuration.schema``); ``lo``/``hi``/``hint`` replace the schema's, and must
  be given for a bound that depends on other fields. ``value``: the field's, unless given (a default
  for a field an older config lacks). Returns the value (an int or float as such)."""
  f = schema.field(path)
  if value is _UNSET:
    value = cfg
    for part in path.split("."):
      value = value[part]
  if f.kind == "bool" and not isinstance(value, bool):
    raise ConfigError(path, value, "True or False")
  if f.kind == "str" and not isinstance(value, str):
    raise ConfigError(path, value, "a string")
  if f.kind == "choice":
    return _check_choice(path, value, f.choices)
  if f.kind not in ("int", "float"):
    return value
  lo, hi = f.lo if lo is None else lo, f.hi if hi is None else hi
  if isinstance(lo, str) or isinstance(hi, str):
    raise TypeError(f"config.{path}: the bound {lo if isinstance(lo, str) else hi} is not given")
  if f.kind == "int":
    return _check_int(path, value, lo, hi, f.hint if hint is None else hint)
  _check_real(path, value, lo, math.inf if hi is None else hi, f.lo_open, f.hi_open)
  return float(value)


def _check_int(
  field: str, value, lo: int | None = None, hi: int | None = None, hint: str = ""
) -> int:
  if isinstance(value, bool) or not isinstance(value, Integral):
    raise ConfigError(field, value, "an integer")
  if (lo is not None and value < lo) or (hi is not None and value > hi):
    rng = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    raise ConfigError(field, value, f"an integer {rng}{hint}")
  return int(value)


def _check_real(field, value, lo, hi, lo_open, hi_open):
  ok = isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)
  if ok:
    ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
  if not ok:
    left, right = "(" if lo_open else "[", ")" if hi_open else "]"
    raise ConfigError(field, value, f"a finite number in {left}{lo}, {hi}{right}")


def _check_choice(field: str, value, allowed):
  if value not in allowed:
    raise ConfigError(field, value, f"one of {', '.join(map(repr, allowed))}")
  return value


@functools.lru_cache(maxsize=8)
def _check_tokenizer(path: str, mtime: float, vocab: int, vocab_field: str) -> None:
  """``natural.load_tokenizer``'s checks, once per file version (a sweep validates each group)."""
  del mtime  # part of the cache key only
  natural.load_tokenizer(path, vocab, vocab_field)


@functools.lru_cache(maxsize=8)
def _tokenizer_special_ids(path: str, mtime: float) -> tuple[int, ...]:
  """Ids of ``<|endoftext|>`` and every token the tokenizer.json at ``path`` marks special
  (``NaturalTextSource.special_ids``: probes never use them); once per file version."""
  from tokenizers import Tokenizer

  del mtime  # part of the cache key only
  tok = Tokenizer.from_file(path)
  ids = {tok.token_to_id(natural.EOT)}
  ids |= {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
  return tuple(sorted(int(i) for i in ids if i is not None))


def _probe_excluded(cfg, source: str) -> tuple[int, str]:
  """(how many ids the probes may not use, what they are): a corpus's end-of-text id and, with a
  user tokenizer.json, every token it marks special (``probes.special_token_ids``)."""
  if source != "natural":
    return 0, ""
  path = os.path.expanduser(cfg.data.tokenizer)
  if cfg.data.tokenizer == "bpe" or not os.path.isfile(path):
    return 1, "the end-of-text id"
  n = len(_tokenizer_special_ids(path, os.path.getmtime(path)))
  return n, f"{n} special id(s) of data.tokenizer (end-of-text, <pad>, …)"


def _validate_natural(cfg, vocab: int, vocab_field: str) -> None:
  """Cheap checks of a natural-text data section; the corpus itself is read (and its length
  checked) when the source is built, still before compiling."""
  for name in (
    "loader",
    "device_budget_mb",
    "val_fraction",
    "split_seed",
    "sample_seed",
    "max_documents",
  ):
    _check(cfg, f"data.{name}")
  if cfg.data.sample_seed and not cfg.data.max_documents:
    raise ConfigError(
      "data.sample_seed",
      cfg.data.sample_seed,
      "0 while data.max_documents = 0 (every document is kept: the seed chooses nothing, and "
      "a sweep over it would train copies)",
    )
  for name in (
    "corpus",
    "files",
    "tfds_name",
    "tfds_split",
    "tfds_data_dir",
    "text_field",
    "tokenizer",
    "cache_dir",
  ):
    _check(cfg, f"data.{name}")
  tokenizer = cfg.data.tokenizer
  if tokenizer == "bpe":
    if vocab < natural.BYTE_LEVEL_MIN_VOCAB:
      raise ConfigError(
        vocab_field,
        vocab,
        f">= {natural.BYTE_LEVEL_MIN_VOCAB} for a byte-level BPE (256 bytes + {natural.EOT})",
      )
  elif not os.path.isfile(os.path.expanduser(tokenizer)):
    raise ConfigError("data.tokenizer", tokenizer, "'bpe' or the path of a tokenizer.json")
  else:  # its vocabulary must fit the model's (checked before the probes' block length)
    path = os.path.expanduser(tokenizer)
    _check_tokenizer(path, os.path.getmtime(path), vocab, vocab_field)
  natural.document_source(cfg.data)  # one of corpus/files/tfds_name; files exist; TFDS known


def _validate_markov(cfg, vocab: int, n_models: int) -> None:
  """The markov source's knobs and transitions (a user matrix and synthetic targets are checked
  in full when the source is built, before compiling)."""
  kind = _check(cfg, "data.transitions")
  _check(cfg, "data.induction_start")
  for name, plural in (("frequency", "frequencies"), ("reliability", "reliabilities")):
    _check(cfg, f"data.{name}")
    values = cfg.data[plural]
    if values and len(values) != n_models:
      raise ConfigError(
        f"data.{plural}",
        values,
        f"empty (all models use data.{name}) or one value per model (ensemble.size = {n_models})",
      )
    for i, v in enumerate(values):
      _check_real(f"data.{plural}[{i}]", v, 0.0, 1.0, False, False)
  _check(cfg, "data.smoothing")
  _check(cfg, "data.tokenizer_vocab")
  context = cfg.train.context_size
  if vocab < context + 1:
    raise ConfigError(
      "model.vocab_size",
      vocab,
      f">= train.context_size + 1 = {context + 1} for data.source = 'markov': a "
      f"sequence must be able to hold C + 1 distinct tokens (first-half draws "
      f"exclude every earlier token)",
    )
  if kind == "file" and not os.path.isfile(os.path.expanduser(cfg.data.matrix_file)):
    raise ConfigError(
      "data.matrix_file",
      cfg.data.matrix_file,
      "the path of a [V, V] .npy transition matrix (data.transitions = 'file')",
    )
  if kind in ("synthetic", "iid"):
    syn = cfg.data.synthetic
    for name in ("marginal", "categoriality", "iterations", "power_iterations", "n_groups", "lr"):
      _check(cfg, f"data.synthetic.{name}")
    if kind == "synthetic":  # unreachable targets (raises markov.MarkovError with both values)
      synthetic.check_spec(synthetic.SyntheticSpec.from_config(syn, vocab))


def _validate_eval(cfg, vocab: int, source: str) -> None:
  every = _check(cfg, "eval.every_steps")
  every = _check(cfg, "eval.every_tokens") or every
  for name in ("n_probes", "n_sequences", "probe_seed"):
    _check(cfg, f"eval.{name}")
  context = cfg.train.context_size
  probe_len = _check(
    cfg,
    "eval.probe_len",
    hi=context // 2,
    hint=f" (0 = min(50, C/2); two copies must fit in C = {context})",
  )

  if 0 < probe_len < MIN_BLOCK:  # even with evaluation off: the analysis makes probes from it
    raise ConfigError(
      "eval.probe_len", probe_len, f"0 (= min(50, C/2)) or >= {MIN_BLOCK}: {MIN_BLOCK_REASON}"
    )
  top_k = _check(cfg, "eval.probe_top_k")
  position = _check(cfg, "eval.probe_position")

  early, late = icl_positions(
    context,
    _check(cfg, "eval.icl_early", hi=context - 1),
    _check(cfg, "eval.icl_late", hi=context - 1),
  )
  if not every:  # no metric computed while training: any C trains (loss curves only)
    return
  if not probe_len and min(MAX_BLOCK, context // 2) < MIN_BLOCK:
    raise ConfigError(
      "train.context_size",
      context,
      f">= {2 * MIN_BLOCK} when evaluating, or eval.every_steps = 0: the probes "
      f"hold a block of L = min(50, C/2) tokens twice, and {MIN_BLOCK_REASON}",
    )
  _check_probe_ids(cfg, vocab, source, probe_len, top_k, position)
  if early >= late:
    raise ConfigError(
      "eval.icl_early",
      cfg.eval.icl_early,
      f"a position before eval.icl_late (resolved: early {early} >= late {late})",
    )


def _check_probe_ids(cfg, vocab: int, source: str, probe_len: int, top_k: int, position: str):
  """A probe block's distinct ids (and a filler id) must exist among the usable ids, or among
  the ``eval.probe_top_k`` most frequent."""
  context = cfg.train.context_size
  block = block_length(context, probe_len)
  excluded, what = _probe_excluded(cfg, source)  # a corpus's end-of-text and special ids
  usable = vocab - excluded
  # Filler before the blocks needs an id outside each block (so the blocks' copies are unique).
  filler = probe_layout(context, probe_len, position)[1] > 2 * block
  need = block + (1 if filler else 0)
  why = f" and one filler id outside it (eval.probe_position = {position!r})" if filler else ""
  if top_k and not need <= top_k <= usable:
    raise ConfigError(
      "eval.probe_top_k",
      top_k,
      f"0 or in [{need}, {usable}]: a probe block holds L = {block} distinct "
      f"ids drawn from the K most frequent{why}"
      + (f"; {usable} of model.vocab_size = {vocab} ids usable ({what} excluded)" if what else ""),
    )
  if not top_k and usable < need:
    raise ConfigError(
      "eval.probe_len",
      probe_len,
      f"a block of at most {usable - (1 if filler else 0)} distinct ids{why} "
      f"(model.vocab_size = {vocab}" + (f", {what} excluded)" if what else ")"),
    )


def _validate_checkpoint(cfg) -> None:
  for name in (
    "params_schedule",
    "points_per_octave",
    "law_points_per_octave",
    "law_window",
    "state_every_steps",
    "state_every_minutes",
    "keep_state",
    "async_save",
  ):
    _check(cfg, f"checkpoint.{name}")
  if cfg.checkpoint.law_file:
    try:
      Law.from_json(os.path.expanduser(cfg.checkpoint.law_file)).updates(
        cfg.train.batch_size, cfg.train.context_size
      )
    except LawError as e:
      raise ConfigError("checkpoint.law_file", cfg.checkpoint.law_file, str(e)) from None


def _validate_log(cfg) -> None:
  """The optional ``log`` section: flags, and the package each chosen writer needs."""
  import importlib.util

  if "log" not in cfg:
    return
  for name, package in (("tensorboard", "tensorboardX"), ("wandb", "wandb")):
    value = _check(cfg, f"log.{name}", cfg.log.get(name, schema.field(f"log.{name}").default))
    if value and importlib.util.find_spec(package) is None:
      raise ConfigError(
        f"log.{name}",
        value,
        f"False, or True with {package} installed "
        f"(pip install {package}, or pip install 'ihsweep[logging]')",
      )
  project = cfg.log.get("wandb_project", schema.field("log.wandb_project").default)
  if not isinstance(project, str) or not project:
    raise ConfigError("log.wandb_project", project, "a non-empty string (the W&B project)")
  _check(cfg, "log.wandb_mode", cfg.log.get("wandb_mode", schema.field("log.wandb_mode").default))


def source_words(kinds) -> str:
  """``data.READS`` keys in words: "'natural' or 'markov' (transitions 'bigram')"."""
  markov = [k.split("/")[1] for k in kinds if k.startswith("markov/")]
  words = [repr(k) for k in kinds if not k.startswith("markov/")]
  if markov:
    words.append(
      "'markov'"
      + (
        ""
        if len(markov) == len(TRANSITIONS)
        else f" (transitions {' or '.join(map(repr, markov))})"
      )
    )
  return " or ".join(words)


def _check_unread_data(data_cfg) -> None:
  """A data field the chosen source does not read must keep its default: any other value would
  change nothing (``data.READS``)."""
  defaults = data.default_config()
  kind = data.source_kind(data_cfg)
  for name in data.unread_fields(data_cfg):
    field, value, default = f"data.{name}", data_cfg.get(name), defaults[name]
    if hasattr(default, "keys"):  # a section (data.synthetic): its first changed field
      changed = [k for k in default.keys() if value.get(k) != default[k]]
      if not changed:
        continue
      field, value, default = f"{field}.{changed[0]}", value[changed[0]], default[changed[0]]
    elif value == default:
      continue
    source, *transitions = data.readers(name)[0].split("/")
    hint = (
      f"--config.data.transitions={transitions[0]}"
      if source == data_cfg.source
      else f"--config.data.source={source}"
    )
    raise ConfigError(
      field,
      value,
      f"its default {default!r} with data.source = {source_words([kind])}, which does "
      f"not read it (only data.source = {source_words(data.readers(name))} does: "
      f"e.g. {hint})",
    )


def _check_distinct_models(cfg, size: int, source: str) -> None:
  """Models of one ensemble sharing a seed must differ in another per-model value; else two
  would train the same model."""
  seeds = tuple(cfg.ensemble.get("seeds", ()))
  if len(set(seeds)) == len(seeds):  # (empty: seeds seed + i)
    return
  per_model = {"ensemble.peak_lrs": tuple(cfg.ensemble.peak_lrs) or (cfg.train.lr,) * size}
  if source == "markov":
    per_model["data.frequencies"] = tuple(cfg.data.frequencies) or (cfg.data.frequency,) * size
    per_model["data.reliabilities"] = (
      tuple(cfg.data.reliabilities) or (cfg.data.reliability,) * size
    )
  models = list(zip(seeds, *per_model.values()))
  for i, model in enumerate(models):
    j = models.index(model)
    if j < i:
      same = [f for f, v in per_model.items() if len(set(v)) > 1]
      raise ConfigError(
        "ensemble.seeds",
        seeds,
        f"distinct seeds, or models sharing a seed that differ in a per-model "
        f"value: models {j} and {i} both have seed {seeds[i]}"
        + (f" and the same {' and '.join(same)}" if same else "")
        + ", so they would train the same model twice",
      )


def _validate_memory_choices(cfg, batch: int, n_data: int) -> None:
  """``train.gradient_accumulation_steps`` (0 = chosen by device memory, else k dividing B with
  B/k split evenly over the mesh's 'data' axis), ``train.remat`` and ``train.attention``; a
  config written before they existed has none (k = 1, no remat, the explicit pattern)."""
  field = "train.gradient_accumulation_steps"
  k = _check(
    cfg,
    field,
    cfg.train.get("gradient_accumulation_steps", 1),
    hi=batch,
    hint=f" (0 = chosen by device memory; at most train.batch_size = {batch})",
  )
  if k and batch % k:
    raise ConfigError(
      field,
      k,
      f"0 (chosen by device memory) or a divisor of train.batch_size = {batch}: one of "
      f"{numbers.some(numbers.divisors(batch), k)}",
    )
  if k and (batch // k) % n_data:
    good = [d for d in numbers.divisors(batch) if (batch // d) % n_data == 0]
    raise ConfigError(
      field,
      k,
      f"0 or one of {numbers.some(good, k)}: each microbatch of B/k = {batch // k} "
      f"sequences is split over the mesh's 'data' axis of {n_data} devices",
    )
  remat = cfg.train.get("remat", "none")
  if remat not in schema.choices("train.remat"):
    raise ConfigError("train.remat", remat, f"one of {', '.join(schema.choices('train.remat'))}")
  attention = cfg.train.get("attention", "explicit")
  if attention not in schema.choices("train.attention"):
    raise ConfigError(
      "train.attention", attention, f"one of {', '.join(schema.choices('train.attention'))}"
    )
  why = attention == "cudnn" and cudnn_attention_problem(ModelConfig.from_config(cfg.model))
  if why:
    raise ConfigError("train.attention", attention, f"auto, explicit or xla: {why}")


def _validate_model(cfg) -> int:
  """The ``model`` section; returns model.vocab_size."""
  _check(cfg, "model.n_layers")
  n_heads = _check(cfg, "model.n_heads")
  d_model = _check(cfg, "model.d_model")
  if d_model % n_heads:
    raise ConfigError(
      "model.n_heads",
      n_heads,
      f"a divisor of model.d_model = {d_model}: one of "
      f"{numbers.some(numbers.divisors(d_model), n_heads)}",
    )
  _check(cfg, "model.d_mlp")
  vocab = _check(cfg, "model.vocab_size")
  _check(cfg, "model.max_context")
  if _check(cfg, "model.pos_encoding") == "rotary" and (d_model // n_heads) % 2:
    raise ConfigError(
      "model.n_heads",
      n_heads,
      f"rotary needs an even head size; d_model / n_heads = {d_model // n_heads}",
    )
  for name in ("dtype", "param_dtype", "tie_embeddings"):
    _check(cfg, f"model.{name}")
  return vocab


def _validate_train(cfg) -> int:
  """The ``train`` section but its memory choices; returns train.batch_size."""
  batch = _check(cfg, "train.batch_size")
  max_context = cfg.model.max_context
  hint = f" (at most model.max_context = {max_context})"
  context = _check(cfg, "train.context_size", hi=max_context, hint=hint)
  if batch * context > INT32_MAX:
    raise ConfigError(
      "train.batch_size",
      batch,
      f"at most {INT32_MAX // context:,} at train.context_size = {context}: an update's tokens "
      f"per model, B·C, are counted in int32 (the loss's mean), so B·C <= {INT32_MAX:,}",
    )
  for name in (
    "num_steps",
    "steps_per_call",
    "lr",
    "schedule",
    "warmup_frac",
    "b1",
    "b2",
    "eps",
    "weight_decay",
    "grad_clip",
  ):
    _check(cfg, f"train.{name}")
  horizon = cfg.train.get("schedule_steps", 0)  # a config written before it: 0
  _check(cfg, "train.schedule_steps", horizon)
  if horizon and horizon < cfg.train.num_steps:
    raise ConfigError(
      "train.schedule_steps",
      horizon,
      f"0 (= train.num_steps) or at least train.num_steps = {cfg.train.num_steps:,}: a "
      f"schedule that ended before training would train on at a learning rate of 0",
    )
  return batch


def _validate_ensemble(cfg) -> int:
  """The ``ensemble`` section's per-model values and the top-level seed; returns
  ensemble.size."""
  size = _check(cfg, "ensemble.size")
  peak_lrs = cfg.ensemble.peak_lrs
  if peak_lrs:
    if len(peak_lrs) != size:
      raise ConfigError(
        "ensemble.peak_lrs",
        peak_lrs,
        f"empty (all models use train.lr) or one value per model (ensemble.size = {size})",
      )
    for i, lr in enumerate(peak_lrs):
      _check_real(f"ensemble.peak_lrs[{i}]", lr, 0.0, math.inf, True, True)
  for name in ("seeds", "cell_ids"):
    values = cfg.ensemble.get(name, ())
    if values and len(values) != size:
      raise ConfigError(
        f"ensemble.{name}", values, f"empty or one value per model (ensemble.size = {size})"
      )
    for i, v in enumerate(values):
      _check_int(
        f"ensemble.{name}[{i}]",
        v,
        0,
        INT32_MAX if name == "seeds" else None,
        " (seeds are int32)" if name == "seeds" else "",
      )
    if name == "cell_ids" and len(set(values)) != len(values):
      raise ConfigError("ensemble.cell_ids", values, "distinct ids")
  seed = _check(cfg, "seed")
  if not cfg.ensemble.get("seeds") and seed + size - 1 > INT32_MAX:
    raise ConfigError(
      "seed",
      seed,
      f"an integer in [0, {INT32_MAX - size + 1}]: the models use "
      f"seeds seed … seed + ensemble.size - 1 = {seed + size - 1}, and seeds are "
      f"int32, at most 2^31 - 1 = {INT32_MAX}",
    )
  return size


def _validate_data(cfg, vocab: int, size: int) -> str:
  """The ``data`` section: the chosen source's fields, and the default of every other one;
  returns data.source."""
  source = _check(cfg, "data.source")
  if source == "markov_chain":
    hint = f" (at most model.vocab_size = {vocab})"
    _check(cfg, "data.n_successors", hi=vocab, hint=hint)
    _check(cfg, "data.chain_seed")
  if source == "repeated_blocks":
    longest = (cfg.train.context_size + 1) // 2
    hint = f" (a block must fit twice in C + 1 = {cfg.train.context_size + 1})"
    block_min = _check(cfg, "data.block_min", hi=longest, hint=hint)
    _check(cfg, "data.block_max", hi=longest)
    if cfg.data.block_max and cfg.data.block_max < block_min:
      raise ConfigError(
        "data.block_max", cfg.data.block_max, f"0 or >= data.block_min = {block_min}"
      )
  if source == "markov":
    _validate_markov(cfg, vocab, size)
  if source == "natural":
    _validate_natural(cfg, vocab, "model.vocab_size")
  elif source == "markov" and cfg.data.transitions == "bigram":
    _validate_natural(cfg, *bigram_corpus_tokens(cfg.data, vocab))
  _check_unread_data(cfg.data)
  _check_distinct_models(cfg, size, source)
  return source


def _validate_devices(cfg, size: int, batch: int, devices) -> None:
  """``mesh.num_devices`` against the devices (see ``validate``), then the choices that depend
  on the mesh: memory, and ``ensemble.vmap_chunk``."""
  whole = devices is None and jax.process_count() > 1  # one global mesh
  devices = jax.devices() if devices is None else devices
  n_avail = len(devices)
  hint = f" (0 = as many of the {n_avail} available devices as the ensemble can use)"
  n_dev = _check(cfg, "mesh.num_devices", hi=n_avail, hint=hint)
  if not n_dev and not whole:  # a small ensemble runs on part of the devices
    n_dev = len(usable_devices(size, batch, devices))
  try:
    n_ens, _ = mesh_shape(size, batch, n_dev or n_avail)
  except MeshError as e:
    raise ConfigError("mesh.num_devices", n_dev, str(e)) from None
  _validate_memory_choices(cfg, batch, (n_dev or n_avail) // n_ens)
  chunk = _check(cfg, "ensemble.vmap_chunk")
  local = size // n_ens
  if chunk and local % chunk:
    raise ConfigError(
      "ensemble.vmap_chunk",
      chunk,
      f"0 (auto) or a divisor of the {local} models per device "
      f"(E = {size} over an ensemble mesh axis of {n_ens})",
    )


def validate(cfg, devices=None) -> None:
  """Checks a whole run config (``configs/*.py`` layout); raises ``ConfigError`` on the first
  bad field (``DataError`` for data that cannot be found or whose targets cannot be reached).
  Each field's kind, range or choices come from ``ihsweep.configuration.schema``; the rules between
  fields are the code below. Does not touch devices beyond counting them: ``devices`` are those the
  run may use (default ``jax.devices()``; a sweep's worker passes its local devices). With
  ``mesh.num_devices`` = 0 and one process (or given ``devices``), an ensemble that cannot use
  them all runs on as many as it can (``sharding.usable_devices``); several processes on one
  global mesh must use all."""
  for section in ("model", "train", "ensemble", "data", "mesh", "eval", "checkpoint"):
    if section not in cfg:
      raise ConfigError(section, None, f"a section '{section}' (see configs/default.py)")
  _check_known_fields(cfg)
  vocab = _validate_model(cfg)
  batch = _validate_train(cfg)
  size = _validate_ensemble(cfg)
  source = _validate_data(cfg, vocab, size)
  _validate_eval(cfg, vocab, source)
  _validate_checkpoint(cfg)
  _validate_log(cfg)
  _validate_devices(cfg, size, batch, devices)


def _validate_budget(cfg) -> None:
  """``sweep.budget`` and the fields it reads."""
  budget = _check(cfg, "sweep.budget")
  horizon = _check(cfg, "sweep.schedule_horizon", cfg.sweep.get("schedule_horizon", "budget"))
  if budget == "tokens" or horizon == "tokens":
    if horizon == "tokens" and not cfg.sweep.tokens:
      raise ConfigError(
        "sweep.tokens",
        cfg.sweep.tokens,
        ">= 1 with sweep.schedule_horizon = 'tokens' (the tokens per model the schedule spans)",
      )
    _check(cfg, "sweep.tokens")
  if budget in ("law", "emergence"):
    _check(cfg, "sweep.law_multiple")
    if cfg.sweep.law_file:
      try:
        Law.from_json(os.path.expanduser(cfg.sweep.law_file))
      except LawError as e:
        raise ConfigError("sweep.law_file", cfg.sweep.law_file, str(e)) from None
  if budget == "emergence":
    # The metrics that may stop a group, and their thresholds: ihsweep.training.metric_registry.
    metric = _check_choice("sweep.stop_metric", cfg.sweep.stop_metric, metric_registry.stop_names())
    rule = metric_registry.get(metric).stop
    threshold = cfg.sweep.stop_threshold
    _check_real("sweep.stop_threshold", threshold, rule.lo, rule.hi, rule.lo_open, rule.hi_open)
    _check(cfg, "sweep.stop_margin")
    if not cfg.eval.every_steps and not cfg.eval.every_tokens:
      raise ConfigError(
        "eval.every_steps",
        cfg.eval.every_steps,
        "> 0 for sweep.budget = 'emergence' (the stop rule reads the online metrics)",
      )


def validate_sweep(cfg, n_devices: int) -> None:
  """The ``sweep`` section of a sweep's config, and the fields a sweep fills per group, before
  anything is planned (``grid.make_plan``); ``n_devices``: the devices the sweep may use.

  Raises:
    ConfigError: naming the field, the value and what is allowed.
  """
  _check(cfg, "sweep.seeds")
  _validate_budget(cfg)
  for field in (
    "ensemble.peak_lrs",
    "ensemble.seeds",
    "ensemble.cell_ids",
    "data.frequencies",
    "data.reliabilities",
  ):
    section, name = field.split(".")
    value = cfg[section].get(name, ())
    if value:
      raise ConfigError(
        field,
        value,
        "empty in a sweep: the planner fills it per group (vary "
        "learning rates and data knobs with sweep.grid, seeds with sweep.seeds)",
      )
  _check(cfg, "sweep.placement")
  _check(cfg, "sweep.wait_to_take_over")
  _check(cfg, "sweep.processes_per_worker", hi=jax.process_count())
