import pytest

from ihsweep.configuration.config import validate
from ihsweep.configuration.fields import ConfigError
from ihsweep.training import runner


@pytest.mark.parametrize(
  "field,value,words",
  [
    ("model.n_heads", 3, ["model.n_heads = 3", "divisor of model.d_model = 32"]),
    ("train.lr", -1e-3, ["train.lr = -0.001", "(0.0, inf)"]),
    ("train.context_size", 64, ["train.context_size = 64", "model.max_context = 32"]),
    ("ensemble.size", 0, ["ensemble.size = 0", ">= 1"]),
    ("model.pos_encoding", "alibi", ["model.pos_encoding = 'alibi'", "'learned', 'rotary'"]),
    ("train.schedule", "linear", ["train.schedule = 'linear'", "'cosine'"]),
    ("train.warmup_frac", 1.5, ["train.warmup_frac = 1.5", "[0.0, 1.0)"]),
    ("data.source", "wiki", ["data.source = 'wiki'", "'uniform', 'markov_chain'"]),
    ("model.d_mlp", -1, ["model.d_mlp = -1", "0 = attention-only"]),
    ("ensemble.peak_lrs", (1e-3,), ["ensemble.peak_lrs = (0.001,)", "ensemble.size = 2"]),
    ("mesh.num_devices", 9, ["mesh.num_devices = 9", "[0, 4]"]),
    ("ensemble.vmap_chunk", 3, ["ensemble.vmap_chunk = 3", "a divisor of the 1 models per device"]),
  ],
)
def test_invalid_config_fails_before_compiling(tiny, tmp_path, no_compile, field, value, words):
  cfg = tiny()
  section, name = field.split(".")
  with cfg.unlocked():
    cfg[section][name] = value
  _assert_refused(cfg, tmp_path, field, words)


def _assert_refused(cfg, tmp_path, field, words):
  """``runner.fit`` refuses ``cfg`` naming ``field`` and every one of ``words``, before it
  creates the run directory."""
  with pytest.raises(ConfigError) as err:
    runner.fit(cfg, str(tmp_path / "run"), progress=False)
  assert err.value.field == field
  for w in words:
    assert w in str(err.value), str(err.value)
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
  "overrides,field,words",
  [
    ({"eval.probe_len": 17}, "eval.probe_len", ["eval.probe_len = 17", "[0, 16]"]),
    ({"eval.probe_top_k": 8}, "eval.probe_top_k", ["0 or in [16, 64]", "L = 16"]),
    ({"eval.icl_early": 20, "eval.icl_late": 10}, "eval.icl_early", ["early 20 >= late 10"]),
    ({"eval.n_probes": 0}, "eval.n_probes", ["eval.n_probes = 0", "[1, 100000]"]),
    ({"eval.probe_len": 1}, "eval.probe_len", ["0 (= min(50, C/2)) or >= 3", "previous token"]),
    ({"checkpoint.points_per_octave": 10**9}, "checkpoint.points_per_octave", ["[1, 64]"]),
    ({"eval.every_tokens": -5}, "eval.every_tokens", ["eval.every_tokens = -5"]),
    ({"checkpoint.params_schedule": "daily"}, "checkpoint.params_schedule", ["'log', 'study'"]),
    ({"checkpoint.law_window": 0.5}, "checkpoint.law_window", ["[1.0, inf)"]),
    ({"train.attention": "flash"}, "train.attention", ["one of auto, explicit, xla, cudnn"]),
    (
      {"train.schedule_steps": 5},
      "train.schedule_steps",
      ["0 (= train.num_steps) or at least train.num_steps = 20", "learning rate of 0"],
    ),
    (
      {"train.attention": "cudnn"},
      "train.attention",
      ["auto, explicit or xla: model.dtype is 'float32'", "takes bfloat16"],
    ),
    (
      {"train.attention": "cudnn", "model.dtype": "bfloat16", "model.n_heads": 8},
      "train.attention",
      ["head dimension d_model / n_heads = 4 must be a multiple of 8 and at most 128"],
    ),
    (  # allowed by the model's shapes, not by the devices (a CPU)
      {"train.attention": "cudnn", "model.dtype": "bfloat16"},
      "train.attention",
      ["auto, explicit or xla: cuDNN runs on GPUs and these devices are cpu"],
    ),
    ({"checkpoint.keep_state": 0}, "checkpoint.keep_state", [">= 1"]),
    ({"checkpoint.state_every_minutes": -1.0}, "checkpoint.state_every_minutes", ["[0.0, inf)"]),
    (
      {"checkpoint.state_every_minutes": float("nan")},
      "checkpoint.state_every_minutes",
      ["a finite number"],
    ),
    (
      {"data.source": "natural", "data.files": "x.txt", "data.sample_seed": -1},
      "data.sample_seed",
      ["data.sample_seed = -1"],
    ),
    (
      {"data.source": "natural", "data.files": "x.txt", "data.sample_seed": 3},
      "data.sample_seed",
      ["0 while data.max_documents = 0"],
    ),
    (
      {"checkpoint.law_file": "/nonexistent/law.json"},
      "checkpoint.law_file",
      ["cannot read a JSON law"],
    ),
    (
      {"data.source": "repeated_blocks", "data.block_min": 17},
      "data.block_min",
      ["[1, 16]", "fit twice"],
    ),
    (
      {"data.source": "repeated_blocks", "data.block_min": 8, "data.block_max": 5},
      "data.block_max",
      [">= data.block_min = 8"],
    ),
  ],
)
def test_invalid_eval_checkpoint_and_source_fields(
  tiny, tmp_path, no_compile, overrides, field, words
):
  cfg = tiny(**{"eval.every_steps": 10, **overrides})
  _assert_refused(cfg, tmp_path, field, words)


def test_rotary_needs_even_head_size(tiny):
  cfg = tiny(**{"model.pos_encoding": "rotary", "model.n_heads": 32})
  with pytest.raises(ConfigError, match="even head size"):
    validate(cfg)


def test_a_mesh_that_would_idle_devices_is_refused_only_where_asked_for(tiny):
  cfg = tiny(**{"ensemble.size": 3, "train.batch_size": 6})
  validate(cfg)  # runs on 3 of the 4 devices (ensemble 3, data 1): usable_devices
  cfg.mesh.num_devices = 4
  with pytest.raises(ConfigError, match="mesh.num_devices = 4.*cannot use all 4 devices"):
    validate(cfg)
  cfg.mesh.num_devices = 3
  validate(cfg)


def test_default_configs_are_valid():
  import configs.default

  validate(configs.default.get_config())
  validate(configs.default.get_config("tiny"))
  import configs.induction

  validate(configs.induction.get_config())
  with pytest.raises(ValueError, match="unknown variant"):
    configs.default.get_config("huge")


@pytest.mark.parametrize(
  "overrides,field,words",
  [
    (
      {"data.frequency": 1.5},
      "data.frequency",
      [
        "data.frequency = 1.5",
        "its default 0.5",
        "'markov_chain', which does not read it",
        "only data.source = 'markov'",
      ],
    ),
    ({"data.smoothing": 0.1}, "data.smoothing", ["'markov' (transitions 'bigram')"]),
    (
      {"data.source": "markov", "data.transitions": "iid", "data.smoothing": 0.1},
      "data.smoothing",
      ["'markov' (transitions 'iid')", "--config.data.transitions=bigram"],
    ),
    (
      {"data.source": "uniform", "data.n_successors": 8},
      "data.n_successors",
      ["'uniform'", "only data.source = 'markov_chain'"],
    ),
    ({"data.synthetic.n_groups": 8}, "data.synthetic.n_groups", ["its default 50"]),
    ({"data.files": "/tmp/*.txt"}, "data.files", ["--config.data.source=natural"]),
  ],
)
def test_fields_the_source_does_not_read_keep_their_defaults(
  tiny, tmp_path, no_compile, overrides, field, words
):
  cfg = tiny(**overrides)
  with pytest.raises(ConfigError) as err:
    runner.fit(cfg, str(tmp_path / "run"), progress=False)
  assert err.value.field == field
  for w in words:
    assert w in str(err.value), str(err.value)
  validate(tiny(**{"data.source": "uniform", "data.frequency": 0.5}))  # the default: accepted


def test_models_that_would_be_identical_are_refused(tiny, tmp_path, no_compile):
  cfg = tiny(**{"ensemble.size": 3, "ensemble.seeds": (5, 5, 6), "mesh.num_devices": 1})
  with pytest.raises(ConfigError) as err:
    runner.fit(cfg, str(tmp_path / "run"), progress=False)
  assert err.value.field == "ensemble.seeds"
  assert "models 0 and 1 both have seed 5" in str(err.value)
  cfg.ensemble.peak_lrs = (1e-3, 1e-3, 2e-3)  # same seed and the same lr: still copies
  with pytest.raises(ConfigError, match="and the same ensemble.peak_lrs, so they would train"):
    validate(cfg)
  cfg.ensemble.peak_lrs = (1e-3, 2e-3, 1e-3)  # same seed, different lrs: different models
  validate(cfg)
  cfg = tiny(
    **{
      "data.source": "markov",
      "data.transitions": "iid",
      "ensemble.seeds": (5, 5),
      "data.frequencies": (0.5, 0.5),
      "data.reliabilities": (0.2, 0.2),
    }
  )
  with pytest.raises(ConfigError, match="models 0 and 1 both have seed 5"):
    validate(cfg)
  cfg.data.reliabilities = (0.2, 0.9)
  validate(cfg)


INT32_MAX = 2**31 - 1


@pytest.mark.parametrize(
  "overrides,field,words",
  [
    (
      {"seed": INT32_MAX},
      "seed",
      ["config.seed = 2147483647", "[0, 2147483646]", "seed + ensemble.size - 1 = 2147483648"],
    ),
    ({"seed": 2**31, "ensemble.size": 1}, "seed", ["config.seed = 2147483648", "[0, 2147483647]"]),
    (
      {"ensemble.seeds": (0, 2**31)},
      "ensemble.seeds[1]",
      ["config.ensemble.seeds[1] = 2147483648", "[0, 2147483647] (seeds are int32)"],
    ),
    (
      {"train.num_steps": 99999999999999999999},
      "train.num_steps",
      ["config.train.num_steps = 99999999999999999999", "[1, 2147483647]", "int32"],
    ),
    ({"train.num_steps": 2**31}, "train.num_steps", ["[1, 2147483647]"]),
  ],
)
def test_seeds_and_updates_must_fit_int32(tiny, tmp_path, no_compile, overrides, field, words):
  with pytest.raises(ConfigError) as err:
    runner.fit(tiny(**overrides), str(tmp_path / "run"), progress=False)
  assert err.value.field == field
  for w in words:
    assert w in str(err.value), str(err.value)
  assert not (tmp_path / "run").exists()  # no config.json left behind


def test_the_largest_int32_seeds_and_updates_are_accepted(tiny):
  validate(tiny(**{"seed": INT32_MAX - 1, "train.num_steps": INT32_MAX}))  # seeds 2^31 - 2, - 1
  validate(tiny(**{"seed": INT32_MAX, "ensemble.seeds": (INT32_MAX, 0)}))  # seed + 1 unused


def test_a_sweeps_seeds_must_fit_int32(tiny, no_compile):
  from ihsweep.configuration import grid as grid_lib

  cfg = tiny(**{"seed": INT32_MAX, "ensemble.size": 2, "sweep.seeds": 2})  # seeds 2^31 - 1, 2^31
  with pytest.raises(  # named by the field the user gave, not the filled ensemble.seeds
    ConfigError,
    match=r"config.seed = 2147483647 is not allowed: an integer in \[0, 2147483646\]: a "
    r"sweep's cells use seeds seed … seed \+ 1",
  ):
    grid_lib.make_plan(cfg)
  cfg.sweep.seeds = cfg.ensemble.size = 1  # the sweep reads sweep.seeds; the two agree
  assert [c.seed for c in grid_lib.make_plan(cfg).cells] == [INT32_MAX]


@pytest.mark.parametrize(
  "path,value,field,words",
  [
    (
      "train.batchsize",
      32,
      "train.batchsize",
      [
        "config.train.batchsize = 32 is not allowed: no such field; did you mean train.batch_size?",
        "(train has: attention, b1, b2, batch_size, context_size,",
      ],
    ),
    ("train.foo", 1, "train.foo", ["no such field (train has: attention, b1,"]),
    ("seeds", 3, "seeds", ["did you mean seed?", "(the config has: checkpoint, data,"]),
    ("data.synthetic.lrr", 0.1, "data.synthetic.lrr", ["did you mean data.synthetic.lr?"]),
    ("eval.every_step", 5, "eval.every_step", ["did you mean eval.every_steps?"]),
    ("ensemble.seed", (1, 2), "ensemble.seed", ["did you mean ensemble.seeds?"]),
    ("model.rotary", True, "model.rotary", ["did you mean model.rotary_base?"]),
  ],
)
def test_unknown_fields_are_refused(tiny, tmp_path, no_compile, path, value, field, words):
  cfg = tiny()
  *parents, name = path.split(".")
  node = cfg
  for part in parents:
    node = node[part]
  with node.unlocked():
    node[name] = value
  _assert_refused(cfg, tmp_path, field, words)


def test_fields_the_code_reads_but_no_config_sets_are_known(tiny):
  cfg = tiny()
  with cfg.unlocked():
    cfg.model.ln_eps = 1e-6  # ModelConfig's, absent from configs/default.py
    cfg.sweep.grid.train = {"batch_size": (8, 16)}  # axes: any field path
    del cfg.ensemble["seeds"]  # configs/induction.py has neither seeds nor cell_ids
    del cfg.ensemble["cell_ids"]
  validate(cfg)


def _special_tokenizer_corpus(tmp_path):
  """A word-level tokenizer.json of 20 ids, 4 of them special (<|endoftext|>, <pad>, <bos>,
  <unk>: ids 0-3), and 4 documents of its 16 words; returns (tokenizer path, files glob)."""
  from tokenizers import Tokenizer, models, pre_tokenizers

  words = [f"w{i}" for i in range(16)]
  special = ["<|endoftext|>", "<pad>", "<bos>", "<unk>"]
  vocab = {t: i for i, t in enumerate(special + words)}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.add_special_tokens(special)
  tok.save(str(tmp_path / "tok.json"))
  for d in range(4):
    (tmp_path / f"doc{d}.txt").write_text(" ".join(words[(d + i) % 16] for i in range(200)))
  return str(tmp_path / "tok.json"), str(tmp_path / "doc*.txt")


def test_probe_ids_exclude_every_special_token_of_a_user_tokenizer(tiny, tmp_path, no_compile):
  """16 of 20 ids are text: a block of L = 16 fits alone ('start'), but not with a filler id
  before it ('end' at C = 33). Counting only the end-of-text id as excluded, validation passed
  and the run failed at startup in make_probes with a traceback, its directory made."""
  tok, files = _special_tokenizer_corpus(tmp_path)

  def cfg(**eval_fields):
    c = tiny(
      **{
        "model.vocab_size": 20,
        "model.max_context": 64,
        "train.context_size": 33,
        "data.source": "natural",
        "data.files": files,
        "data.tokenizer": tok,
        "data.cache_dir": str(tmp_path / "cache"),
        "eval.every_steps": 10,
        "eval.probe_len": 16,
      }
    )
    c.eval.update(eval_fields)
    return c

  validate(cfg(probe_position="start"))  # 16 text ids hold one block
  _assert_refused(
    cfg(probe_position="end"),
    tmp_path,
    "eval.probe_len",
    ["a block of at most 15 distinct ids", "4 special id(s) of data.tokenizer"],
  )
  _assert_refused(
    cfg(probe_position="end", probe_len=15, probe_top_k=17),
    tmp_path,
    "eval.probe_top_k",
    ["0 or in [16, 16]", "16 of model.vocab_size = 20 ids usable"],
  )


def test_a_schedule_over_the_token_budget_needs_one(tiny):
  from ihsweep.configuration import axes as axes_lib
  from ihsweep.configuration import grid as grid_lib

  cfg = tiny(**{"sweep.schedule_horizon": "tokens", "train.num_steps": 200})  # the default
  axes_lib.add_axes(cfg, ["train.batch_size=8,16"])
  with pytest.raises(ConfigError, match="sweep.schedule_horizon = 'tokens' .the tokens per model"):
    grid_lib.make_plan(cfg)
  cfg.sweep.tokens = 8 * 32 * 5  # 5 updates at B 8, 3 at B 16 (ceil), the schedule = the budget
  cfg.sweep.budget = "tokens"
  plan = grid_lib.make_plan(cfg)
  assert sorted(g.num_steps for g in plan.groups) == [3, 5]
  assert {g.cfg.train.schedule_steps for g in plan.groups} == {0}


@pytest.mark.parametrize(
  "value,ok", [(0, True), (1, True), (2, True), (4, True), (3, False), (8, False), (-1, False)]
)
def test_devices_per_worker_is_zero_or_a_divisor_of_the_process_devices(tiny, value, ok):
  """sweep.devices_per_worker on this session's 4 CPU devices (2 with mesh.num_devices = 2)."""
  from ihsweep.configuration.config import validate_sweep

  cfg = tiny(**{"sweep.devices_per_worker": value})
  if ok:
    validate_sweep(cfg, 4)
  else:
    with pytest.raises(ConfigError, match=r"a divisor of this process's 4 devices: 1, 2, 4"):
      validate_sweep(cfg, 4)
  cfg = tiny(**{"sweep.devices_per_worker": 4, "mesh.num_devices": 2})
  with pytest.raises(ConfigError, match=r"sweep.devices_per_worker = 4 .*process's 2 devices"):
    validate_sweep(cfg, 4)
  # mesh.num_devices fixes a group's mesh: a worker of fewer devices could not hold it
  cfg = tiny(**{"sweep.devices_per_worker": 1, "mesh.num_devices": 2})
  with pytest.raises(ConfigError, match=r"= 1 is not allowed: 0 or 2 with mesh.num_devices = 2"):
    validate_sweep(cfg, 4)
