"""Default run: an ensemble of 4 small GPT-2-style models on a fixed sparse Markov chain.

Run (2-core CPU: about 3 minutes; the tiny variant about 1 minute):
  ihsweep train --config=configs/default.py --workdir=runs/default
Override any field:
  ihsweep train --config=configs/default.py --workdir=runs/x --config.train.lr=1e-3 \
      --config.ensemble.size=8 --config.model.pos_encoding=rotary
Variants via the argument string: ``configs/default.py:tiny`` (the benchmark's tiny workload),
``configs/default.py:python_docs`` (natural text: the Python documentation, byte-level BPE at
model.vocab_size; run ``ihsweep corpus fetch python-docs`` once first), or both:
``configs/default.py:tiny,python_docs``.
"""

import ml_collections

from ihsweep import config, data


def get_config(arg: str = ""):
  c = ml_collections.ConfigDict()
  c.seed = 0  # model i of the ensemble uses seed + i

  c.model = ml_collections.ConfigDict(
    dict(
      n_layers=2,
      n_heads=4,
      d_model=128,
      d_mlp=512,
      vocab_size=4096,
      max_context=128,
      pos_encoding="learned",
      tie_embeddings=True,
      dtype="auto",
      param_dtype="float32",
    )
  )

  c.train = ml_collections.ConfigDict(
    dict(
      batch_size=16,
      context_size=128,
      num_steps=200,
      steps_per_call=50,
      lr=1e-3,
      schedule="cosine",
      warmup_frac=0.01,
      b1=0.9,
      b2=0.999,
      eps=1e-8,
      weight_decay=0.0,
      grad_clip=1.0,
      # Memory (same numbers either way; ihsweep.memory): k microbatches of B/k per update
      # and block rematerialisation, 0 / auto = the cheapest that fits the device's memory
      # (on a CPU, which reports none: k = 1, no remat).
      gradient_accumulation_steps=0,
      remat="auto",
    )
  )

  # seeds: per-model seeds (empty = seed + i); cell_ids: ids in logs (empty = 0…E-1; a sweep
  # sets both); vmap_chunk: models vmapped together per device (0 = auto: all on GPU/TPU,
  # cache-sized on CPU)
  c.ensemble = ml_collections.ConfigDict(
    dict(size=4, peak_lrs=(), seeds=(), cell_ids=(), vmap_chunk=0)
  )

  c.data = data.default_config()  # every field documented in ihsweep.data.default_config
  c.data.update(source="markov_chain", n_successors=4, chain_seed=0)

  c.mesh = ml_collections.ConfigDict(dict(num_devices=0))  # 0 = every device
  c.eval = config.default_eval()  # online metrics; fields in ihsweep.config.default_eval
  c.checkpoint = config.default_checkpoint()  # fields in ihsweep.config.default_checkpoint
  c.sweep = config.default_sweep()  # `ihsweep run`'s grid and budget: ihsweep.config.default_sweep
  c.log = config.default_log()  # live TensorBoard / W&B writers: ihsweep.config.default_log

  for variant in filter(None, arg.split(",")):
    if variant == "tiny":
      c.model.update(d_model=64, d_mlp=256, vocab_size=512, max_context=64)
      c.train.update(batch_size=8, context_size=64)
    elif variant == "python_docs":
      c.data.update(source="natural", corpus="python-docs")
    else:
      raise ValueError(
        f"configs/default.py: unknown variant {variant!r}; allowed: 'tiny', "
        f"'python_docs', or both comma-separated"
      )
  return c
