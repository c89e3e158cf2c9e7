"""analysis/positions.py: where in the context a head works, on hand-built heads with known
answers."""

import numpy as np
import pandas as pd
import pytest
from test_metrics import CFG, induction_circuit

from analysis import positions
from ihsweep.data import probes
from ihsweep.runs.notebook import Model

C = CFG.max_context  # 32
BLOCK = 4


def _blocks(n=12):
  ids = probes.probe_candidates(CFG.vocab_size)
  rep = probes.repeated_token_probes(0, n, BLOCK, ids)
  return rep[:, :BLOCK]


def test_placed_probes_put_the_same_blocks_at_each_place():
  blocks = _blocks()
  where = {"start": 0, "middle": C // 2 - BLOCK, "end": C - 2 * BLOCK}
  for place, first in where.items():
    t = positions.placed_probes(blocks, C, place)
    assert t.shape == (len(blocks), first + 2 * BLOCK) and t.dtype == np.int32
    np.testing.assert_array_equal(t[:, first : first + BLOCK], blocks)
    np.testing.assert_array_equal(t[:, first + BLOCK :], blocks)
    for row, b in zip(t, blocks):  # the filler never holds a block id: one earlier match
      assert not set(row[:first]) & set(b)


def _gated(last_position: int):
  """The hand-built circuit with its previous-token head (layer 0) only at positions
  ≤ ``last_position``: beyond, layer 0 attends uniformly and the induction head finds nothing."""
  params = {k: v for k, v in induction_circuit().items()}
  kernel = np.array(params["block_0"]["attn"]["qkv"]["kernel"])
  from test_metrics import POS

  kernel[POS + last_position + 1 : POS + C, 0] = 0.0  # no query beyond last_position
  params["block_0"] = {**params["block_0"], "attn": {**params["block_0"]["attn"]}}
  params["block_0"]["attn"]["qkv"] = {"kernel": kernel, **{
    k: v for k, v in params["block_0"]["attn"]["qkv"].items() if k != "kernel"
  }}  # fmt: skip
  return params


def test_a_hand_built_induction_head_works_everywhere_and_a_gated_one_only_early():
  blocks = _blocks()
  full = Model(0, 0, CFG, induction_circuit())
  for place in positions.PLACES:
    s = positions.place_scores(full, positions.placed_probes(blocks, C, place), BLOCK)
    # At the start, position 0 (no previous token) attends to itself, so its PREV is its own
    # token and the first second-block query splits between keys 0 and 1: PS 7/8 at L = 4.
    ps, acc = (0.85, 0.6) if place == "start" else (0.95, 0.95)
    assert s["ps"][1, 0] > ps and s["acc"] > acc, (place, s)
    assert s["ps"][0, 0] < 0.1  # the previous-token head does not prefix-match
  gated = Model(0, 0, CFG, _gated(C // 2 + 1))
  got = {
    p: positions.place_scores(gated, positions.placed_probes(blocks, C, p), BLOCK)
    for p in positions.PLACES
  }
  assert got["start"]["ps"][1, 0] > 0.85 and got["middle"]["ps"][1, 0] > 0.95, got
  assert got["end"]["ps"][1, 0] < 0.3 and got["end"]["acc"] < 0.3, got


def test_words_name_the_places_where_working_heads_fail():
  row = dict(seed=0, step=100, head="L1H0", probe_position="middle", block_len=8)
  table = pd.DataFrame(
    [
      {**row, "cell": 0, "batch_size": 8, "context_size": 64, "ps_start": 0.8, "ps_middle": 0.9,
       "ps_end": 0.05, "acc_start": 0.8, "acc_middle": 0.99, "acc_end": 0.02},
      {**row, "cell": 1, "batch_size": 8, "context_size": 32, "ps_start": 0.85, "ps_middle": 0.9,
       "ps_end": 0.9, "acc_start": 0.8, "acc_middle": 0.99, "acc_end": 0.98},
      {**row, "cell": 2, "batch_size": 8, "context_size": 16, "ps_start": 0.02, "ps_middle": 0.02,
       "ps_end": 0.02, "acc_start": 0.0, "acc_middle": 0.0, "acc_end": 0.0},
    ]
  )  # fmt: skip
  text = positions.words(table)
  assert "over 3 models" in text, text
  assert "at the end (the last 2L positions) 0.32 (0.02–0.90)" in text, text
  # Only cell 0 works on its own probes and fails elsewhere; cell 2 never worked.
  assert "score below 0.3 at the end for 1 of 3: B 8 × C 64:" in text, text
  assert "C 16:" not in text and "B 8 × C 16" not in text
  assert "At C = 16 (= 2L) the three places are the same input." in text, text
  assert "see data.induction_start" in text  # not known where the repeats were placed
  assert "see data.induction_start" in positions.words(table, {"half", "anywhere"})
  anywhere = positions.words(table, {"anywhere"})  # already everywhere: no stale hint
  assert "see data.induction_start" not in anywhere and "put repeats)." in anywhere, anywhere
  cells = positions.by_cell(table)
  assert list(cells["context_size"]) == [16, 32, 64] and list(cells["ps_end"]) == [0.02, 0.9, 0.05]
  assert positions.words(table.iloc[1:2]).count("score below") == 0
  # Another grid axis keeps its points apart, in the table and in the words.
  axis = table.assign(**{"data.induction_start": ["half", "half", "anywhere"], "context_size": 64})
  cells = positions.by_cell(axis)
  assert list(cells["data.induction_start"]) == ["anywhere", "half"] and list(cells["models"]) == [
    1,
    2,
  ]
  assert "data.induction_start half, B 8 × C 64:" in positions.words(axis)


def test_filler_comes_from_the_vocabulary_when_the_probes_hold_no_other_id():
  """One probe block of 8 ids in a vocabulary of 10: the filler before it can only use the 2
  ids outside the block; with a vocabulary of 8, no place but the start can be probed."""
  blocks = np.arange(8)[None]
  t = positions.placed_probes(blocks, 32, "end", vocab_size=10)
  assert set(t[0, :16]) <= {8, 9} and list(t[0, 16:]) == list(range(8)) * 2
  assert positions.placed_probes(blocks, 32, "start").shape == (1, 16)
  with pytest.raises(ValueError, match="needs an id outside it; the vocabulary has 8"):
    positions.placed_probes(blocks, 32, "middle", vocab_size=8)
