"""Kernels per update read from an optimised HLO module (ihsweep.planning.kernels), and the
plan's per-update lower bounds (targets.update_time_terms): known answers on hand-written HLO."""

import pytest

from ihsweep.planning import chips, kernels, targets, toolchain
from ihsweep.training import memory

# One call: a fusion and a sampler's loop of traced trip count (a condition, a fusion and a
# two-way conditional of 2 fusions: 4) before the update loop (once per call); the update loop
# (traced trip count, named by its op_name) whose condition is one fusion and whose body has
# a GEMM, a cuDNN call, a copy, free instructions, a loop of 3 known iterations (a fusion and a
# GEMM each) and a conditional whose larger branch has 2 fusions. (HLO lines are long: ruff's
# E501 is off for this string.)
HLO = """HloModule jit_train_call, entry_computation_layout={()->()}

%fused_a (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %n = f32[4]{0} negate(%p)
}

%gemm_body (p0: bf16[2,8,16], p1: bf16[2,16,4]) -> f32[2,8,4] {
  %p0 = bf16[2,8,16]{2,1,0} parameter(0)
  %p1 = bf16[2,16,4]{2,1,0} parameter(1)
  ROOT %dot.1 = f32[2,8,4]{2,1,0} dot(%p0, %p1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

%inner_cond (t: (s32[])) -> pred[] {
  %t = (s32[]) parameter(0)
  ROOT %c = pred[] constant(true)
}

%inner_body (t: (s32[])) -> (s32[]) {
  %t = (s32[]) parameter(0)
  %f = f32[4]{0} fusion(%t), kind=kLoop, calls=%fused_a
  %g = f32[2,8,4]{2,1,0} fusion(%t), kind=kCustom, calls=%gemm_body, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  ROOT %r = (s32[]) tuple(%t)
}

%small (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  ROOT %f1 = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_a
}

%large (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %f1 = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_a
  ROOT %f2 = f32[4]{0} fusion(%f1), kind=kLoop, calls=%fused_a
}

%update_cond (t: (s32[], f32[4])) -> pred[] {
  %t = (s32[], f32[4]) parameter(0)
  ROOT %lt = pred[] fusion(%t), kind=kLoop, calls=%fused_a
}

%update_body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]) parameter(0)
  %x = f32[4]{0} get-tuple-element(%t), index=1
  %g0 = f32[2,8,4]{2,1,0} fusion(%x), kind=kCustom, calls=%gemm_body, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %att = (bf16[2,8,4]{2,1,0}, u8[0]{0}) custom-call(%x), custom_call_target="__cudnn$fmhaSoftmax"
  %cp = f32[2,131072]{1,0} copy(%x)
  %b = f32[4]{0} bitcast(%x)
  %loop = (s32[]) while(%t), condition=%inner_cond, body=%inner_body, backend_config={"known_trip_count":{"n":"3"}}
  %i = s32[] constant(0)
  %br = f32[4]{0} conditional(%i, %x, %x), branch_computations={%small, %large}
  ROOT %r = (s32[], f32[4]) tuple(%i, %br)
}

%sampler_body (t: (s32[], f32[4])) -> (s32[], f32[4]) {
  %t = (s32[], f32[4]) parameter(0)
  %x = f32[4]{0} get-tuple-element(%t), index=1
  %s1 = f32[4]{0} fusion(%x), kind=kLoop, calls=%fused_a
  %c = pred[] constant(true)
  %two = f32[4]{0} conditional(%c, %x, %x), true_computation=%large, false_computation=%small
  ROOT %r = (s32[], f32[4]) tuple(%t, %two)
}

ENTRY %main (a: f32[4]) -> f32[4] {
  %a = f32[4]{0} parameter(0)
  %pre = f32[4]{0} fusion(%a), kind=kLoop, calls=%fused_a
  %t = (s32[], f32[4]) tuple(%a, %pre)
  %sampled = (s32[], f32[4]) while(%t), condition=%update_cond, body=%sampler_body, metadata={op_name="jit(train_call)/while_loop/while"}
  %w = (s32[], f32[4]) while(%sampled), condition=%update_cond, body=%update_body, metadata={op_name="jit(train_call)/ihsweep_updates/while"}
  ROOT %out = f32[4]{0} get-tuple-element(%w), index=1
}
"""  # noqa: E501


def test_kernels_per_update_follow_loops_branches_and_library_calls():
  k = kernels.per_update(HLO)
  # condition 1 + GEMM 1 + cuDNN 1 + copy 1 + 3 × (fusion + GEMM) + larger branch 2 = 12
  assert k["kernels"] == 12
  assert k["gemms"] == 1 + 1 + 3  # the Triton GEMMs and the cuDNN call
  assert k["layout_copies"] == 1
  assert k["once_per_call"] == 1 + 4  # the fusion and the sampler's loop before it
  assert k["kinds"] == {
    "fusion": 6, "__triton_nested_gemm_fusion": 4, "__cudnn$fmha": 1, "layout copy": 1
  }  # fmt: skip
  assert kernels.dots_by_dtype(k["computations"], k["gemms_list"]) == {"bf16,bf16->f32": 4}
  assert kernels.shape_bytes("(bf16[2,8,4]{2,1,0}, u8[0]{0})") == 2 * 8 * 4 * 2
  assert kernels.shape_bytes("f32[2,131072]{1,0}") == 2 * 131072 * 4


def test_a_program_without_an_update_loop_is_one_update():
  flat = HLO.replace("jit(train_call)/ihsweep_updates/while", "jit(f)/while")
  k = kernels.per_update(flat)
  assert k["kernels"] == 1 + 4 + 12 and k["once_per_call"] == 0
  assert k["gemms"] == len(k["gemms_list"]) == 5


def test_the_update_loop_is_named_where_the_train_program_makes_it():
  from ihsweep.compute import train

  assert train.UPDATE_LOOP_SCOPE == kernels.UPDATE_LOOP_SCOPE


def test_the_roofline_terms_are_flops_memory_and_launches():
  chip = chips.GPUS["h100-80gb"]
  target = toolchain.Target("h100-80gb", chip, [], 1, 1, "test")
  lowered = memory.ProgramMemory(0, 0, 10**9, 0, 0, cost_from="lowered HLO", kernels_per_update=300)
  terms = targets.update_time_terms(lowered, 989e12 * 1e-3, 5e12, target)
  # 1 ms of FLOPs; twice the 1 GB state over 3.35 TB/s; 300 launches × 4 µs
  assert terms == pytest.approx(
    {"flops_s": 1e-3, "state_bytes_s": 2e9 / 3.35e12, "launch_s": 300 * 4e-6}
  )
  compiled = memory.ProgramMemory(0, 0, 10**9, 0, 0, cost_from="compiled program")
  assert targets.update_time_terms(compiled, 0.0, 3.35e12, target) == pytest.approx(
    {"flops_s": 0.0, "bytes_s": 1.0}
  )
