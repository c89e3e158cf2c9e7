import jax
import numpy as np

from ihsweep.data.builtin import MarkovChainSource, UniformSource, _chain_table


def test_markov_chain_follows_its_table():
  src = MarkovChainSource(vocab_size=50, batch_size=6, context_size=40, n_successors=3, seed=1)
  tokens = np.asarray(jax.jit(src.sample)(jax.random.PRNGKey(0), {}, src.arrays()))
  assert tokens.shape == (6, 41) and tokens.dtype == np.int32
  succ, probs = _chain_table(50, 3, 1)
  for row in tokens:
    for a, b in zip(row[:-1], row[1:]):
      assert b in succ[a]
  assert 0 < src.entropy_rate() < np.log(3)


def test_markov_chain_transition_frequencies():
  src = MarkovChainSource(vocab_size=8, batch_size=256, context_size=64, n_successors=2, seed=0)
  tokens = np.asarray(src.sample(jax.random.PRNGKey(1), {}, src.arrays()))
  succ, probs = _chain_table(8, 2, 0)
  a, b = tokens[:, :-1].ravel(), tokens[:, 1:].ravel()
  checked = 0
  for tok in range(8):
    nxt = b[a == tok]
    if len(nxt) < 100:
      continue
    share, p = np.mean(nxt == succ[tok, 0]), probs[tok, 0]
    assert abs(share - p) < 4 * np.sqrt(p * (1 - p) / len(nxt)), (tok, share, p, len(nxt))
    checked += 1
  assert checked >= 3


def test_uniform_source_and_keys():
  src = UniformSource(vocab_size=16, batch_size=4, context_size=8)
  a = src.sample(jax.random.PRNGKey(0), {}, src.arrays())
  assert a.shape == (4, 9) and int(a.max()) < 16 and int(a.min()) >= 0
  assert not np.array_equal(a, src.sample(jax.random.PRNGKey(1), {}, src.arrays()))
  assert src.entropy_rate() == np.log(16)


def test_repeated_blocks_repeat_one_block_from_a_random_offset():
  from ihsweep.data.builtin import RepeatedBlocksSource

  src = RepeatedBlocksSource(
    vocab_size=1000, batch_size=64, context_size=40, block_min=3, block_max=8
  )
  seqs = np.asarray(src.sample(jax.random.PRNGKey(0), {}, {}))
  assert seqs.shape == (64, 41) and seqs.dtype == np.int32
  periods, starts = set(), set()
  for s in seqs:  # V = 1000: chance repeats are rare, so the period is the smallest shift
    found = [
      (st, period)
      for period in range(3, 9)
      for st in range(0, 41 - 2 * period + 1)
      if (s[st + period :] == s[st : 41 - period]).all()
    ]
    assert found, s
    st, period = min(found)
    periods.add(period)
    starts.add(st)
  assert periods == set(range(3, 9)) and len(starts) > 10  # lengths and offsets both vary
