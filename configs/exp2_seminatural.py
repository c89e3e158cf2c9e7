"""Experiment 2 of the study: semi-natural data, repetition frequency × reliability.

Sequences come from a Markov chain whose transitions are the bigram statistics of a real
corpus, with induction patterns ``A B … A → B`` injected at two per-model rates
(``ihsweep/data/markov.py``): ``data.frequency`` (how often an earlier token recurs) and
``data.reliability`` (P(B | A B … A)). Both are vmapped knobs, so the whole frequency ×
reliability grid × seeds is one group: one compiled ensemble. The study finds a Pareto
frontier below which induction heads do not form, more sensitive to reliability than to
frequency (docs/study.md, finding 2); ``python -m analysis report`` draws the map and frontier.

Study scale (default; for accelerators): the study's recipe as far as it is published —
bigrams of 100M tokens of Common Crawl text (here C4 via TFDS, ``max_documents`` 250,000 ≈
100M tokens) restricted to the V = 10,000 most frequent BPE types, +1e-6 smoothing; sequences
of C = 64; a GPT-2-style 2-layer, 8-head, d_model 768 model with MLPs; AdamW, peak lr 2.5e-4,
cosine, 1% warmup; 100M training tokens per model (B = 32 is our choice; the study's batch
size for this experiment is not known to us). Grid: frequency × reliability ∈ {0.05, 0.1, 0.2,
0.3, 0.5, 0.7, 0.9}² × 2 seeds = 98 models in one group, sharded over the ensemble axis of
every device (~22M parameters each; ~35 GB of params + Adam state in all):

  tfds build c4/en --file_format=array_record --data_dir=$TFDS   # once
  sbatch launch/slurm.sbatch --config=configs/exp2_seminatural.py --workdir=/shared/exp2 \
      --config.data.tfds_data_dir=$TFDS
  python -m analysis report /shared/exp2

CPU scale (``configs/exp2_seminatural.py:scale=cpu``, 22 min on 2 shared cores): the demo's data and
model (``configs/demo.py``: python-docs bigrams over V = 256 types mixed half-and-half with the
uniform distribution, 2-layer attention-only d_model 64) at B = 16, C = 64, frequency ×
reliability ∈ {0.25, 0.5, 0.75, 1.0}², one seed, 3,000 updates. Results: docs/results.md.

  ihsweep run --config=configs/exp2_seminatural.py:scale=cpu --workdir=runs/exp2_cpu

The law at CPU scale (``scale=cpu_law``, 70 min on 2 shared cores, ~55 min alone): the corner
that ``scale=cpu`` found, frequency ∈ {0.75, 0.875, 1} × reliability ∈ {0.9, 0.95, 1} × 2 seeds,
5,000 updates, otherwise as ``scale=cpu``; every model emerged, and ``fit-law
--terms=data.frequency,data.reliability`` fits the law in both (docs/results.md, section 3b).

  ihsweep run --config=configs/exp2_seminatural.py:scale=cpu_law --workdir=runs/exp2_cpu_law
"""

import ml_collections

from configs import default, demo
from ihsweep.configuration import fields

STUDY_LEVELS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9)
CPU_LEVELS = (0.25, 0.5, 0.75, 1.0)
# scale=cpu_law: the corner where scale=cpu found heads (frequency >= 0.75, reliability 1 within
# 3,000 updates), 3 x 3 levels x 2 seeds for 5,000 updates (~1.9x the slowest cell seen there):
# the law in frequency and reliability (docs/results.md, "Experiment 2 as a law"). 3 x 3, not
# 4 x 4: an ensemble of 32 trains at 1.1 updates/s on the 2-core CPU (90 min for 6,000 updates).
LAW_FREQUENCY = (0.75, 0.875, 1.0)
LAW_RELIABILITY = (0.9, 0.95, 1.0)
LAW_UPDATES = 5000


def _parse(arg: str) -> str:
  items = [kv.split("=", 1) for kv in filter(None, arg.split(","))]
  opts = dict(kv for kv in items if len(kv) == 2)
  scale = opts.get("scale", "study")
  if scale not in ("study", "cpu", "cpu_law") or set(opts) - {"scale"} or len(opts) < len(items):
    raise ValueError(
      f"{__name__}: argument {arg!r}; allowed: 'scale=study' (default), 'scale=cpu' or "
      f"'scale=cpu_law'"
    )
  return scale


def markov_base(scale: str, cpu_updates: int):
  """Model, optimiser, evaluation, checkpoints and budget shared by Experiments 2 and 3 (their
  data sections and grids are their own). ``scale``: 'study' or 'cpu' (the demo's model at
  B = 16, C = 64 for ``cpu_updates`` updates)."""
  if scale == "cpu":
    c = demo.get_config()
    c.model.update(max_context=64)
    c.train.update(batch_size=16, context_size=64, num_steps=cpu_updates)
    # the demo's early stop back to the defaults: only the 'emergence' budget reads it
    stop = ("law_multiple", "stop_metric", "stop_threshold", "stop_margin")
    c.sweep.update(budget="updates", **{k: fields.default_sweep()[k] for k in stop})
    return c
  c = default.get_config()
  c.model.update(
    n_layers=2,
    n_heads=8,
    d_model=768,
    d_mlp=3072,
    vocab_size=10_000,
    max_context=64,
    tie_embeddings=True,
  )
  c.train.update(
    batch_size=32,
    context_size=64,
    lr=2.5e-4,
    schedule="cosine",
    warmup_frac=0.01,
    steps_per_call=100,
  )
  c.eval.update(every_steps=0, every_tokens=1_000_000)
  c.checkpoint.update(params_schedule="study")
  c.sweep.update(budget="tokens", tokens=100_000_000)
  return c


def get_config(arg: str = ""):
  scale = _parse(arg)
  if scale == "cpu_law":
    c = markov_base("cpu", cpu_updates=LAW_UPDATES)
    levels = dict(frequency=LAW_FREQUENCY, reliability=LAW_RELIABILITY)
    c.sweep.grid = ml_collections.ConfigDict(dict(data=ml_collections.ConfigDict(levels)))
    c.sweep.seeds = 2  # models per grid point (ensemble.size stays at its default: unread)
    return c
  c = markov_base(scale, cpu_updates=3000)
  if scale == "cpu":
    levels, seeds = CPU_LEVELS, 1
  else:
    c.data.update(
      source="markov",
      transitions="bigram",
      tfds_name="c4/en",
      max_documents=250_000,
      smoothing=1e-6,
    )
    levels, seeds = STUDY_LEVELS, 2
  c.sweep.grid = ml_collections.ConfigDict(
    dict(data=ml_collections.ConfigDict(dict(frequency=levels, reliability=levels)))
  )
  # models per grid point; ensemble.size, unread where sweep.seeds is set, stays at its default
  # so that --config.sweep.seeds=N alone changes them
  c.sweep.seeds = seeds
  return c
