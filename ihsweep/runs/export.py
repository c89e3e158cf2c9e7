"""A trained model in code we did not write: TransformerLens and Hugging Face transformers.

``to_transformer_lens(model)`` builds a TransformerLens ``HookedTransformer`` and ``to_hf(model)``
a Hugging Face ``GPT2LMHeadModel`` holding one ihsweep model's params (``model``: a notebook
``Model`` from ``ihsweep.load_run(DIR).model(cell, step)``, or a params dict with its
``ihsweep.compute.model.ModelConfig``). Both compute the same logits as
``ihsweep.compute.model.Transformer``
(tests/test_export.py: float64 to 1e-9, float32 to 1e-4). ``export_run(run, cell, step, to,
out)`` (``ihsweep export``, ``Run.export``; ``run`` from ``ihsweep.load_run``) writes one of
them to a file:

* ``to='transformer_lens'``: ``out`` is one file, ``torch.save`` of a dict with ``cfg`` (the
  ``HookedTransformerConfig`` keyword arguments), ``state_dict`` (the model's
  ``state_dict()``, float32) and ``ihsweep`` (where it came from: run directory, cell, step,
  the ihsweep model config). Open it with ``load_transformer_lens(out)``, or by hand::

    blob = torch.load(out)
    model = HookedTransformer(blob["cfg"])
    model.load_state_dict(blob["state_dict"])

* ``to='hf'``: ``out`` is a directory written by ``save_pretrained`` (``config.json``,
  ``model.safetensors``, ``generation_config.json``) plus ``ihsweep_source.json``; open it with
  ``GPT2LMHeadModel.from_pretrained(out)``. No tokenizer is written: ids are the model's own
  (``Run.tokenizer()`` decodes those of a natural-text run).

Every ihsweep architecture maps to TransformerLens exactly (``model`` fields: learned or rotary
``pos_encoding``, attention-only ``d_mlp = 0`` or with a GELU MLP, tied or untied embeddings,
``ln_eps``, ``rotary_base``): pre-LayerNorm blocks with biased LayerNorms (``normalization_type
'LN'``, ``eps = ln_eps``), biases on Q, K, V, O and the MLP, GELU with the tanh approximation
(``act_fn 'gelu_new'``), scores scaled by 1/sqrt(d_head), no unembedding bias (``b_U = 0``).
Rotary positions are GPT-NeoX's half-split rotation of the whole head (``rotary_dim = d_head``,
``rotary_adjacent_pairs = False``): dimension j < d_head/2 pairs with j + d_head/2 and turns at
angle ``position · rotary_base^(−2j/d_head)`` (``ihsweep.compute.model.rotary``; TransformerLens's
``calculate_sin_cos_rotary`` and ``rotate_every_two``). A tied unembedding is exported as
``W_U = W_Eᵀ``, a copy (TransformerLens's decoder-only models have no tied weights): editing
``W_E`` afterwards does not change ``W_U``.

GPT-2 has learned positions and an MLP in every block, so a rotary model or an attention-only
one is refused (``ExportError`` naming the field and its value), never exported as something
else. Params stored in bfloat16 are exported exactly (bfloat16 → float32 is exact); a model
trained with ``model.dtype`` bfloat16 then runs in float32, as ihsweep's own float32 forward of
the same params does.

torch, transformer-lens and transformers are the optional ``interop`` extra
(``pip install 'ihsweep[interop]'``): imported inside the functions, so ``import ihsweep`` and
training never import torch.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Mapping

import numpy as np

from ihsweep.base.errors import IhsweepError

TARGETS = ("transformer_lens", "hf")
DTYPES = ("float32", "float64")
INSTALL = "pip install 'ihsweep[interop]'"
TL_FORMAT = "ihsweep-transformer-lens/1"


class ExportError(IhsweepError, ValueError):
  """A model, target or output path that cannot be exported (the message names what is
  allowed)."""


def _require(module: str, what: str):
  """``import module``, or ModuleNotFoundError naming the extra that installs it."""
  import importlib

  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    top = module.split(".")[0]
    if e.name is None or e.name.split(".")[0] != top:
      raise
    raise ModuleNotFoundError(
      f"{what} needs {top}, which is not installed: {INSTALL} (torch, transformer-lens and "
      f"transformers)",
      name=e.name,
    ) from e


# ------------------------------------------------------------------ what maps where


def _target_error(to) -> str | None:
  return None if to in TARGETS else f"to = {to!r}: one of {', '.join(repr(t) for t in TARGETS)}"


def _check_target(to) -> None:
  why = _target_error(to)
  if why is not None:
    raise ExportError(why)


def _check_dtype(dtype) -> None:
  if dtype not in DTYPES:
    raise ExportError(f"dtype = {dtype!r}: one of {DTYPES}")


def unsupported(cfg, to: str) -> str | None:
  """Why the ihsweep ``ModelConfig`` ``cfg`` cannot be exported exactly to target ``to``
  (one of ``TARGETS``), naming the field and its value; None when it can."""
  from ihsweep.compute.model import POS_ENCODINGS

  if to not in TARGETS:
    return _target_error(to)
  if cfg.pos_encoding not in POS_ENCODINGS:
    return f"model.pos_encoding = {cfg.pos_encoding!r}: one of {POS_ENCODINGS}"
  if to == "hf":
    if cfg.pos_encoding != "learned":
      return (
        f"model.pos_encoding = {cfg.pos_encoding!r}: GPT-2 has learned positions only; use "
        f"--to=transformer_lens"
      )
    if cfg.d_mlp == 0:
      return (
        "model.d_mlp = 0 (attention-only): every GPT-2 block has an MLP; use "
        "--to=transformer_lens (attn_only)"
      )
  return None


def _check(cfg, to: str) -> None:
  why = unsupported(cfg, to)
  if why is not None:
    raise ExportError(f"cannot export to {to}: {why}" if to in TARGETS else why)


def _resolve(model, cfg) -> tuple[dict, Any]:
  """``(params as numpy arrays, ModelConfig)`` from a notebook ``Model`` (``.params``,
  ``.config``) or a params dict with ``cfg`` (a ``ModelConfig`` or a mapping of its fields)."""
  from ihsweep.compute.model import ModelConfig

  if cfg is None:
    if not (hasattr(model, "params") and hasattr(model, "config")):
      raise ExportError(
        "model: a notebook Model (ihsweep.load_run(DIR).model(cell, step)), or a params dict "
        "together with cfg (its ihsweep.compute.model.ModelConfig)"
      )
    model, cfg = model.params, model.config
  elif hasattr(model, "params") and hasattr(model, "config"):
    model = model.params
  if isinstance(cfg, Mapping):
    cfg = ModelConfig.from_config(cfg)
  if not isinstance(cfg, ModelConfig):
    raise ExportError(
      f"cfg: an ihsweep.compute.model.ModelConfig or a mapping, got {type(cfg).__name__}"
    )
  if "params" in model and "embed" not in model:  # {"params": ...} as given to Module.apply
    model = model["params"]

  def arrays(node):
    if isinstance(node, Mapping):
      return {k: arrays(v) for k, v in node.items()}
    return np.asarray(node)

  return arrays(model), cfg


def _unembed_VxD(p: dict, cfg) -> np.ndarray:
  return p["embed"]["embedding"] if cfg.tie_embeddings else p["unembed"]


# ------------------------------------------------------------------ TransformerLens


def transformer_lens_config(cfg, dtype: str = "float32", device: str = "cpu") -> dict:
  """The ``HookedTransformerConfig`` keyword arguments of ihsweep ``ModelConfig`` ``cfg`` (the
  mapping is in the module docstring); ``dtype`` ``'float32'`` or ``'float64'``."""
  torch = _require("torch", "export to TransformerLens")
  _check(cfg, "transformer_lens")
  _check_dtype(dtype)
  out = dict(
    model_name="ihsweep",
    n_layers=cfg.n_layers,
    d_model=cfg.d_model,
    n_heads=cfg.n_heads,
    d_head=cfg.d_head,
    d_vocab=cfg.vocab_size,
    d_vocab_out=cfg.vocab_size,
    n_ctx=cfg.max_context,
    normalization_type="LN",
    eps=float(cfg.ln_eps),
    attn_only=cfg.d_mlp == 0,
    positional_embedding_type="standard" if cfg.pos_encoding == "learned" else "rotary",
    original_architecture="ihsweep",
    default_prepend_bos=False,  # ihsweep models see no BOS token
    init_weights=False,  # every weight is loaded
    device=device,
    dtype=getattr(torch, dtype),
  )
  if cfg.d_mlp:
    out.update(d_mlp=cfg.d_mlp, act_fn="gelu_new")  # jax.nn.gelu(approximate=True)
  if cfg.pos_encoding == "rotary":
    out.update(
      rotary_dim=cfg.d_head, rotary_base=float(cfg.rotary_base), rotary_adjacent_pairs=False
    )
  return out


def transformer_lens_state_dict(params, cfg) -> dict[str, np.ndarray]:
  """TransformerLens parameter names → numpy arrays (params' storage dtype) for ihsweep params
  ``params`` (one model, no ensemble axis) of ``ModelConfig`` ``cfg``. Q/K/V come from the
  fused ``qkv`` kernel ``[d_model, 3, n_heads, d_head]`` (index 0, 1, 2), transposed to
  TransformerLens's ``[n_heads, d_model, d_head]``."""
  p, cfg = _resolve(params, cfg)
  sd = {"embed.W_E": p["embed"]["embedding"]}
  if cfg.pos_encoding == "learned":
    sd["pos_embed.W_pos"] = p["pos_embed"]
  for i in range(cfg.n_layers):
    b, tl = p[f"block_{i}"], f"blocks.{i}"
    sd[f"{tl}.ln1.w"], sd[f"{tl}.ln1.b"] = b["ln_1"]["scale"], b["ln_1"]["bias"]
    kernel_Dx3xHxK, bias_3xHxK = b["attn"]["qkv"]["kernel"], b["attn"]["qkv"]["bias"]
    for j, name in enumerate("QKV"):
      sd[f"{tl}.attn.W_{name}"] = np.transpose(kernel_Dx3xHxK[:, j], (1, 0, 2))
      sd[f"{tl}.attn.b_{name}"] = bias_3xHxK[j]
    sd[f"{tl}.attn.W_O"], sd[f"{tl}.attn.b_O"] = b["attn"]["w_o"], b["attn"]["b_o"]
    if cfg.d_mlp:
      sd[f"{tl}.ln2.w"], sd[f"{tl}.ln2.b"] = b["ln_2"]["scale"], b["ln_2"]["bias"]
      sd[f"{tl}.mlp.W_in"], sd[f"{tl}.mlp.b_in"] = b["mlp_in"]["kernel"], b["mlp_in"]["bias"]
      sd[f"{tl}.mlp.W_out"], sd[f"{tl}.mlp.b_out"] = b["mlp_out"]["kernel"], b["mlp_out"]["bias"]
  sd["ln_final.w"], sd["ln_final.b"] = p["ln_f"]["scale"], p["ln_f"]["bias"]
  w_U = _unembed_VxD(p, cfg).T
  sd["unembed.W_U"] = w_U
  sd["unembed.b_U"] = np.zeros(w_U.shape[1], w_U.dtype)
  return sd


def _hooked_transformer(kwargs: dict, what: str):
  """An uninitialised-on-device ``HookedTransformer`` of ``HookedTransformerConfig`` keyword
  arguments ``kwargs``, without TransformerLens 3.x's deprecation warning (HookedTransformer
  is what 4.0 replaced by its bridge, which holds Hugging Face architectures only)."""
  import warnings

  tl = _require("transformer_lens", what)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return tl.HookedTransformer(tl.HookedTransformerConfig(**kwargs), move_to_device=False)


def _load_into(module, arrays: dict[str, np.ndarray], dtype: str, what: str) -> None:
  """Copies ``arrays`` into ``module``'s parameters, each cast to ``dtype``; every trainable
  parameter must be among them, with its shape (ExportError otherwise: a mapping bug, never a
  silently random weight)."""
  torch = _require("torch", what)
  own = dict(module.named_parameters())
  missing = sorted(set(own) - set(arrays))
  extra = sorted(set(arrays) - set(own))
  if missing or extra:
    raise ExportError(f"{what}: parameters not mapped {missing}, unknown {extra}")
  with torch.no_grad():
    for name, value in arrays.items():
      value = np.asarray(value, dtype=np.float64 if dtype == "float64" else np.float32)
      if tuple(own[name].shape) != value.shape:
        raise ExportError(
          f"{what}: {name} has shape {tuple(own[name].shape)}, the export {value.shape}"
        )
      own[name].copy_(torch.tensor(value))


def to_transformer_lens(model, cfg=None, *, dtype: str = "float32", device: str = "cpu"):
  """A TransformerLens ``HookedTransformer`` computing the same logits as the ihsweep model.

  Args:
    model: a notebook ``Model`` (``ihsweep.load_run(DIR).model(cell, step)``), or one model's
      params (nested dict, no ensemble axis, e.g. ``run.params(cell, step)``) with ``cfg``.
    cfg: the ``ihsweep.compute.model.ModelConfig`` of params (or a mapping of its fields).
    dtype: ``'float32'`` or ``'float64'`` (the torch parameters and computation).
    device: the torch device.

  Returns:
    ``HookedTransformer`` in eval mode, weights not processed (no LayerNorm folding, no
    centring: ``model.process_weights_()`` does that, keeping the logits up to a shift).
    ``model(tokens)`` with int64 tokens ``[B, T]`` (T ≤ model.max_context) gives float logits
    ``[B, T, vocab_size]``; ``run_with_cache`` gives ``pattern`` (attention probabilities)
    etc.

  Raises:
    ModuleNotFoundError: the ``interop`` extra is not installed (the message says how).
    ExportError: a config that does not map, or a bad dtype.
  """
  params, cfg = _resolve(model, cfg)
  out = _hooked_transformer(
    transformer_lens_config(cfg, dtype, device), "export to TransformerLens"
  )
  _load_into(out, transformer_lens_state_dict(params, cfg), dtype, "export to TransformerLens")
  return out.to(device, print_details=False).eval()


def load_transformer_lens(path: str | os.PathLike, device: str = "cpu"):
  """The ``HookedTransformer`` in a file written by ``export_run(..., to='transformer_lens')``
  (``ihsweep export --to=transformer_lens``)."""
  torch = _require("torch", "load_transformer_lens")
  blob = torch.load(os.fspath(path), map_location=device)
  if not isinstance(blob, dict) or blob.get("format") != TL_FORMAT:
    raise ExportError(f"{path}: not a TransformerLens export of ihsweep (format {TL_FORMAT})")
  model = _hooked_transformer({**blob["cfg"], "device": device}, "load_transformer_lens")
  model.load_state_dict(blob["state_dict"])
  return model.to(device, print_details=False).eval()


# ------------------------------------------------------------------ Hugging Face GPT-2


def hf_config(cfg) -> dict:
  """The ``transformers.GPT2Config`` keyword arguments of ihsweep ``ModelConfig`` ``cfg``
  (learned positions and an MLP only: ``unsupported(cfg, 'hf')``). Dropout 0; GELU with the
  tanh approximation (``gelu_new``); no BOS/EOS ids (ihsweep models have none)."""
  _check(cfg, "hf")
  return dict(
    vocab_size=cfg.vocab_size,
    n_positions=cfg.max_context,
    n_embd=cfg.d_model,
    n_layer=cfg.n_layers,
    n_head=cfg.n_heads,
    n_inner=cfg.d_mlp,
    activation_function="gelu_new",
    layer_norm_epsilon=float(cfg.ln_eps),
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
    scale_attn_weights=True,
    scale_attn_by_inverse_layer_idx=False,
    reorder_and_upcast_attn=False,
    tie_word_embeddings=bool(cfg.tie_embeddings),
    bos_token_id=None,
    eos_token_id=None,
  )


def hf_state_dict(params, cfg) -> dict[str, np.ndarray]:
  """``GPT2LMHeadModel`` parameter names → numpy arrays. GPT-2's ``Conv1D`` weights are
  ``[in, out]`` like Flax kernels; ``c_attn`` is the fused ``qkv`` kernel ``[d_model, 3,
  n_heads, d_head]`` flattened to ``[d_model, 3 · d_model]`` (q, k, v, each heads-major, as
  GPT-2 splits it); ``c_proj`` is ``W_O`` ``[n_heads, d_head, d_model]`` flattened to
  ``[d_model, d_model]``. A tied model has no ``lm_head.weight`` of its own (it is ``wte``)."""
  p, cfg = _resolve(params, cfg)
  _check(cfg, "hf")
  d = cfg.d_model
  sd = {"transformer.wte.weight": p["embed"]["embedding"], "transformer.wpe.weight": p["pos_embed"]}
  for i in range(cfg.n_layers):
    b, h = p[f"block_{i}"], f"transformer.h.{i}"
    sd[f"{h}.ln_1.weight"], sd[f"{h}.ln_1.bias"] = b["ln_1"]["scale"], b["ln_1"]["bias"]
    sd[f"{h}.attn.c_attn.weight"] = b["attn"]["qkv"]["kernel"].reshape(d, 3 * d)
    sd[f"{h}.attn.c_attn.bias"] = b["attn"]["qkv"]["bias"].reshape(3 * d)
    sd[f"{h}.attn.c_proj.weight"] = b["attn"]["w_o"].reshape(d, d)
    sd[f"{h}.attn.c_proj.bias"] = b["attn"]["b_o"]
    sd[f"{h}.ln_2.weight"], sd[f"{h}.ln_2.bias"] = b["ln_2"]["scale"], b["ln_2"]["bias"]
    sd[f"{h}.mlp.c_fc.weight"], sd[f"{h}.mlp.c_fc.bias"] = (
      b["mlp_in"]["kernel"],
      b["mlp_in"]["bias"],
    )
    sd[f"{h}.mlp.c_proj.weight"], sd[f"{h}.mlp.c_proj.bias"] = (
      b["mlp_out"]["kernel"],
      b["mlp_out"]["bias"],
    )
  sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = p["ln_f"]["scale"], p["ln_f"]["bias"]
  if not cfg.tie_embeddings:
    sd["lm_head.weight"] = p["unembed"]
  return sd


def to_hf(model, cfg=None, *, dtype: str = "float32"):
  """A Hugging Face ``GPT2LMHeadModel`` computing the same logits as the ihsweep model.

  Args:
    model, cfg: as ``to_transformer_lens``.
    dtype: ``'float32'`` or ``'float64'``.

  Returns:
    ``GPT2LMHeadModel`` in eval mode; ``model(input_ids).logits`` with int64 ids ``[B, T]``
    (T ≤ model.max_context) is ``[B, T, vocab_size]``.

  Raises:
    ModuleNotFoundError: the ``interop`` extra is not installed.
    ExportError: a rotary or attention-only model (GPT-2 has neither), or a bad dtype.
  """
  params, cfg = _resolve(model, cfg)
  kwargs = hf_config(cfg)
  _check_dtype(dtype)
  transformers = _require("transformers", "export to Hugging Face")
  torch = _require("torch", "export to Hugging Face")
  out = transformers.GPT2LMHeadModel(transformers.GPT2Config(**kwargs)).to(getattr(torch, dtype))
  arrays = hf_state_dict(params, cfg)
  if cfg.tie_embeddings:
    if out.lm_head.weight is not out.transformer.wte.weight:
      raise ExportError("export to Hugging Face: GPT2LMHeadModel did not tie lm_head to wte")
  _load_into(out, arrays, dtype, "export to Hugging Face")
  return out.eval()


# ------------------------------------------------------------------ files


def _check_out(out, run_dir=None) -> str:
  """``out`` (``~`` expanded) if it names a new path in an existing directory outside
  ``run_dir``; ExportError naming ``--out`` otherwise."""
  if out is None or not os.fspath(out):
    raise ExportError(
      "--out=: a path to write to is needed (a new file for transformer_lens, a new directory "
      "for hf)"
    )
  out = os.path.expanduser(os.fspath(out))
  if os.path.lexists(out):
    raise ExportError(
      f"--out={out} exists: export writes a new path only (never over a file it did not "
      f"write); remove it or choose another"
    )
  parent = os.path.dirname(os.path.abspath(out))
  if not os.path.isdir(parent):
    raise ExportError(f"--out={out}: its directory {parent} does not exist")
  if run_dir is not None:
    inside = os.path.join(os.path.realpath(parent), os.path.basename(os.path.abspath(out)))
    if _in_run(inside, run_dir) and not _in_exports(inside, run_dir):
      raise ExportError(
        f"--out={out} is inside the run directory {run_dir} but not under "
        f"{export_dir(run_dir)}: ihsweep and its report read and write names there "
        f"(checkpoints/, groups/, analysis/law.json, …; a directory under checkpoints/ would be "
        f"read as a checkpoint); leave out --out (the default is under that folder) or write "
        f"outside the run"
      )
  return out


def export_dir(run_dir) -> str:
  """``RUN/analysis/export``: the one folder inside a run directory that exports may use."""
  return os.path.join(os.fspath(run_dir), "analysis", "export")


def _in_run(path: str, run_dir) -> bool:
  root = os.path.realpath(os.fspath(run_dir))
  return os.path.commonpath([os.path.realpath(path), root]) == root


def _in_exports(path: str, run_dir) -> bool:
  """``path`` lies strictly under the run's export folder, where that folder is where it
  should be (a symlinked analysis/ pointing elsewhere inside the run does not count)."""
  folder = os.path.realpath(export_dir(run_dir))
  expected = export_dir(os.path.realpath(os.fspath(run_dir)))
  real = os.path.realpath(path)
  placed = folder == expected or not _in_run(folder, run_dir)
  return placed and real != folder and os.path.commonpath([real, folder]) == folder


def default_out(run_dir, cell: int, step: int, to: str) -> str:
  """Where ``ihsweep export`` writes without ``--out``: ``RUN/analysis/export/cell<N>_step<S>.pt``
  for transformer_lens, ``…/cell<N>_step<S>_hf`` (a directory) for hf; the folder is created
  (after checking that it does not resolve elsewhere inside the run).

  Raises: ExportError when the folder resolves elsewhere inside the run or cannot be created
  (a read-only run directory: the OS's reason, and what to do).
  """
  folder = export_dir(run_dir)
  name = f"cell{cell}_step{step}" + (".pt" if to == "transformer_lens" else "_hf")
  out = os.path.join(folder, name)
  if not _in_exports(out, run_dir):
    raise ExportError(
      f"--out not given: its default folder {folder} resolves to {os.path.realpath(folder)}, "
      f"elsewhere inside the run directory {run_dir}; give --out=PATH outside the run"
    )
  if os.path.lexists(out):
    raise ExportError(
      f"--out not given: its default {out} exists (an earlier export of cell {cell} at update "
      f"{step}); it is never overwritten: remove it or give --out=PATH"
    )
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    raise ExportError(
      f"--out not given: its default folder {folder} cannot be created ({e.strerror or e}); "
      f"give --out=PATH outside the run directory"
    ) from None
  return out


def _umask() -> int:
  mask = os.umask(0)
  os.umask(mask)
  return mask


def save(
  model, out, to: str, cfg=None, source: Mapping[str, Any] | None = None, run_dir=None
) -> str:
  """Writes ``model`` (as ``to_transformer_lens``/``to_hf`` take it) to the new path ``out``
  in the ``to`` format (the module docstring); ``source``: what to record about its origin;
  ``run_dir``: the run directory it came from (``out`` may not lie inside it). The file (or
  directory) appears whole: written beside ``out``, then renamed.

  Returns: ``out``.
  Raises: ExportError for an existing ``out``, a missing parent directory, an ``out`` inside
  ``run_dir``, a write that fails (the OS's reason: permissions, a full disk, a name too long;
  nothing is left behind), an unknown ``to`` or a config that does not map;
  ModuleNotFoundError without the ``interop`` extra.
  """
  _check_target(to)
  params, cfg = _resolve(model, cfg)
  _check(cfg, to)
  out = _check_out(out, run_dir)
  import dataclasses

  meta = {"ihsweep_model_config": dataclasses.asdict(cfg), **dict(source or {})}
  if to == "transformer_lens":
    torch = _require("torch", "export to TransformerLens")
    kwargs = transformer_lens_config(cfg)
    kwargs.pop("device")
    blob = {
      "format": TL_FORMAT,
      "cfg": kwargs,
      "state_dict": to_transformer_lens(params, cfg).state_dict(),
      "ihsweep": meta,
    }
  else:
    hf_model = to_hf(params, cfg)
  import tempfile

  where = dict(dir=os.path.dirname(os.path.abspath(out)), prefix=f".{os.path.basename(out)}.")
  tmp = None  # a new name beside out (mkstemp/mkdtemp): never a path someone else owns
  try:
    try:
      if to == "transformer_lens":
        fd, tmp = tempfile.mkstemp(suffix=".tmp", **where)
        with os.fdopen(fd, "wb") as f:
          torch.save(blob, f)
      else:
        tmp = tempfile.mkdtemp(suffix=".tmp", **where)
        hf_model.save_pretrained(tmp)
        with open(os.path.join(tmp, "ihsweep_source.json"), "w") as f:
          json.dump(meta, f, indent=2)
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp's 0700 → what mkdir would have made
      if os.path.lexists(out):  # appeared meanwhile: leave it alone
        raise FileExistsError(out)
      if os.path.isdir(tmp):
        os.rename(tmp, out)
      else:  # a hard link fails where out appeared since the check; rename would replace it
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 → what open would have made
        try:
          os.link(tmp, out)
        except FileExistsError:
          raise
        except OSError:  # a file system without hard links
          os.rename(tmp, out)
    except FileExistsError:
      raise ExportError(f"--out={out} appeared while exporting: left as it is") from None
    except (OSError, RuntimeError) as e:  # RuntimeError: torch's writer (a full disk)
      why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
      raise ExportError(f"--out={out}: cannot be written ({why[:200]})") from e
  finally:
    if tmp is not None and os.path.isdir(tmp) and not os.path.islink(tmp):
      shutil.rmtree(tmp, ignore_errors=True)
    elif tmp is not None and os.path.lexists(tmp):
      os.remove(tmp)
  return out


def export_run(run, cell: int, step: int | None = None, to: str = "transformer_lens", out=None):
  """``ihsweep export``: model ``cell`` of ``run`` (an ``ihsweep.load_run`` result: this module
  does not open run directories itself) after ``step`` updates (default: its last saved step)
  written to the new path ``out`` for ``to`` (``'transformer_lens'``: one torch file; ``'hf'``:
  a ``save_pretrained`` directory); without ``out``, under the run's ``analysis/export/``
  (``default_out``).

  Returns: ``(out, step)``.
  Raises: ``ihsweep.runs.notebook.UnknownCell`` (cell, naming the valid ids), ``StepNotSaved``
  (step, naming the saved steps; with no ``step``, the cell has no complete checkpoint),
  ``CheckpointUnreadable`` (a damaged checkpoint at that step), ``ExportError`` (also for
  ``out`` inside the run directory), ModuleNotFoundError.
  """
  _check_target(to)
  cfg = run.model_config(cell)  # UnknownCell first, before any checkpoint is read
  _check(cfg, to)
  if step is None and not run.steps(cell):  # no default step: name what is missing, not a step
    from ihsweep.runs.notebook import StepNotSaved

    group = run.group_of(cell)
    single = group == "run"  # ihsweep train's run directory: no groups/
    where = os.path.join(*([] if single else ["groups", group]), "checkpoints", "params")
    raise StepNotSaved(
      f"cell {int(cell)}{'' if single else f' (group {group})'} has no complete params "
      f"checkpoint to export: none was saved yet, or {where} was removed from the run directory"
    )
  model = run.model(cell, step)  # StepNotSaved
  source = {"run_dir": run.dir, "cell": int(model.cell), "step": int(model.step)}
  if out is None:
    out = default_out(run.dir, int(model.cell), int(model.step), to)
  return save(model, out, to, source=source, run_dir=run.dir), int(model.step)
