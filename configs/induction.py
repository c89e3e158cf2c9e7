"""The classic induction task: watch induction heads form on a CPU in a few minutes.

2-layer attention-only models (d_model 64, 4 heads) on uniform random tokens (V = 64) in which one
random block recurs at a random gap (``data.source = 'repeated_blocks'``: block length and gap
drawn per sequence, so position alone cannot solve the copy); B = 16, C = 64, lr 1e-3, an
ensemble of 4 seeds. ``metrics.jsonl`` shows the transition: on this 2-core CPU, ps_max rose
from ~0.04 to > 0.9 and associative-recall accuracy on the repeated-token probes from ~0.02 to
> 0.9 (measurements in the README, "Online metrics").

  ihsweep train --config=configs/induction.py --workdir=runs/induction
"""

import ml_collections

from configs import default


def get_config(arg: str = ""):
  del arg
  c = default.get_config()
  c.model.update(n_layers=2, n_heads=4, d_model=64, d_mlp=0, vocab_size=64, max_context=64)
  c.train.update(batch_size=16, context_size=64, num_steps=3000, steps_per_call=50, lr=1e-3,
                 schedule="constant", warmup_frac=0.01)
  c.ensemble = ml_collections.ConfigDict(dict(size=4, peak_lrs=(), vmap_chunk=0))
  c.data.update(source="repeated_blocks", block_min=4, block_max=0)
  c.eval.update(every_steps=100)
  c.checkpoint.update(state_every_steps=1000)
  return c
