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

from ihsweep import data
from ihsweep.base import schema
from ihsweep.configuration import fields


def get_config(arg: str = ""):
  c = ml_collections.ConfigDict()
  c.seed = schema.field("seed").default  # model i of the ensemble uses seed + i
  # Every section's fields, defaults, allowed values and help: ihsweep.base.schema (and the
  # reference in docs/configuration.md generated from it).
  c.model = schema.defaults("model")
  c.train = schema.defaults("train")  # memory choices 0 / auto: chosen by device memory
  c.ensemble = schema.defaults("ensemble")  # per-model seeds, cell_ids, peak_lrs: empty = shared
  c.data = data.default_config()
  c.data.update(source="markov_chain", n_successors=4, chain_seed=0)

  c.mesh = schema.defaults("mesh")  # 0 = every device
  c.eval = fields.default_eval()  # online metrics
  c.checkpoint = fields.default_checkpoint()
  c.sweep = fields.default_sweep()  # `ihsweep run`'s grid and budget
  c.log = fields.default_log()  # live TensorBoard / W&B writers

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
