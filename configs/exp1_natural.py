"""Experiment 1 of the study: natural text, batch size B × context size C.

The study's headline: the update at which induction heads emerge follows
UPT = T / (B^0.37 · C^0.62), ln T = 13.26, independent of model size (docs/study.md).
``ihsweep run`` trains the grid; ``python -m analysis report`` fits the law with intervals and
sets it beside the study's.

Study scale (default; for accelerators): C4 English via TFDS (the study used CC100-en, which
TFDS does not publish; C4 is the closest Common Crawl corpus there), a byte-level BPE of
50,257 types trained on it (or ``--config.data.tokenizer=gpt2/tokenizer.json`` for GPT-2's
own), GPT-2-style models of 2 layers, 8 heads, d_model 768, d_mlp 3072, tied embeddings;
AdamW with peak lr 2.5e-4, cosine schedule, 1% warmup, gradient clipping 1.0 (the study's
code's HF Trainer defaults); 1B tokens per model (the study's steps = 1e9 / (B·C)), checkpoints
at the study's token counts. Grid: B ∈ {8, 16, 32, 64, 128} × C ∈ {64, 128, 256, 512, 1024} × 2
seeds = 50 models in 25 groups. ``:scale=study,models=3`` adds a model-size axis (d_model 256 /
512 / 768 with 4 / 8 / 12 heads) to test the study's size independence. Budget: the study's 1B
tokens; ``--config.sweep.budget=emergence --config.sweep.law_multiple=3`` stops each group once
every model has emerged and trained on to 2× that update (and saves most of the compute). The
learning-rate schedule spans the study's token budget either way (``sweep.schedule_horizon``
'tokens': its 1% warmup and cosine decay as in the study), so an early stop only ends training.

  tfds build c4/en --file_format=array_record --data_dir=$TFDS     # once (needs TensorFlow)
  ihsweep corpus prepare --config=configs/exp1_natural.py --config.data.tfds_data_dir=$TFDS
  sbatch launch/slurm.sbatch --config=configs/exp1_natural.py --workdir=/shared/exp1 \
      --config.data.tfds_data_dir=$TFDS                              # or launch/tpu_pod.sh
  python -m analysis report /shared/exp1

CPU scale (``configs/exp1_natural.py:scale=cpu``): the natural-text grid the 2-core
development machine can run — the embedded python-docs corpus, BPE 2,048, 2 layers, 4 heads,
d_model 128 with MLPs (d_mlp 512), untied unembedding, constant lr 1e-3, probes from the 512
most frequent tokens, B ∈ {8, 16, 32} × C ∈ {32, 64, 128} × 2 seeds, 1M tokens per model
(~25 min, estimated from the calibration run's 15,000 tokens/s). On this machine it does not
reach the transition: the study's law puts these cells
at 10,000–30,000 updates (5–50M tokens), and the calibration runs (docs/results.md) saw no
induction head on this text within 20,000–60,000 updates of smaller models. It is here to
measure the pre-transition curves and to show the censored-cell analysis; the demo
(configs/demo.py) uses semi-natural data from the same corpus instead.

  ihsweep corpus fetch python-docs
  ihsweep run --config=configs/exp1_natural.py:scale=cpu --workdir=runs/exp1_cpu
"""

import ml_collections

from configs import default

MODEL_SIZES = ((4, 256, 1024), (8, 512, 2048), (12, 768, 3072))  # (heads, d_model, d_mlp)


def _options(arg: str) -> dict:
  items = [kv.split("=", 1) for kv in filter(None, arg.split(","))]
  opts = dict(kv for kv in items if len(kv) == 2)
  allowed = {"scale": ("study", "cpu"), "models": ("1", "3")}
  for key, value in opts.items() if len(opts) == len(items) else [("", "")]:
    if key not in allowed or value not in allowed[key]:
      raise ValueError(
        f"{__name__}: argument {arg!r}; allowed: scale=study|cpu, models=1|3 "
        f"(models=3 only at scale=study)"
      )
  return {"scale": opts.get("scale", "study"), "models": int(opts.get("models", "1"))}


def get_config(arg: str = ""):
  opts = _options(arg)
  c = default.get_config()
  c.data.update(source="natural")
  grid = ml_collections.ConfigDict()
  if opts["scale"] == "cpu":
    c.model.update(
      n_layers=2,
      n_heads=4,
      d_model=128,
      d_mlp=512,
      vocab_size=2048,
      max_context=128,
      tie_embeddings=False,
    )
    c.train.update(lr=1e-3, schedule="constant", warmup_frac=0.01, steps_per_call=50)
    c.data.update(corpus="python-docs")
    c.eval.update(every_tokens=65_536, probe_top_k=512)
    c.checkpoint.update(params_schedule="log", points_per_octave=2, law_points_per_octave=0)
    grid.train = ml_collections.ConfigDict(dict(batch_size=(8, 16, 32), context_size=(32, 64, 128)))
    c.sweep.update(budget="tokens", tokens=1_000_000, seeds=2, schedule_horizon="tokens")
  else:
    c.model.update(
      n_layers=2,
      n_heads=8,
      d_model=768,
      d_mlp=3072,
      vocab_size=50_257,
      max_context=1024,
      tie_embeddings=True,
    )
    c.train.update(lr=2.5e-4, schedule="cosine", warmup_frac=0.01, steps_per_call=100)
    c.data.update(tfds_name="c4/en", max_documents=2_500_000)  # ≈ 1B tokens
    c.eval.update(every_steps=0, every_tokens=1_000_000)
    c.checkpoint.update(params_schedule="study")
    grid.train = ml_collections.ConfigDict(
      dict(batch_size=(8, 16, 32, 64, 128), context_size=(64, 128, 256, 512, 1024))
    )
    c.sweep.update(budget="tokens", tokens=1_000_000_000, seeds=2, schedule_horizon="tokens")
    if opts["models"] == 3:
      c.sweep.zip = ml_collections.ConfigDict(
        dict(
          model=ml_collections.ConfigDict(
            dict(
              n_heads=tuple(s[0] for s in MODEL_SIZES),
              d_model=tuple(s[1] for s in MODEL_SIZES),
              d_mlp=tuple(s[2] for s in MODEL_SIZES),
            )
          )
        )
      )
  if opts["scale"] == "cpu" and opts["models"] != 1:
    raise ValueError(f"{__name__}: models=3 is a study-scale option")
  c.sweep.grid = grid
  return c
