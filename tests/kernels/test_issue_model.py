"""The static roofline of triton_aot: the SASS loop parser and the issue model's arithmetic, on hand-made input.

(The model on the real kernels' machine code is in test_aot_triton.py, `make test-aot`.)
"""

import pytest

from lrl_jax import quant
from lrl_jax.kernels import triton_aot as aot
from lrl_jax.kernels.blocks import BlockConfig, plan

# cuobjdump -sass layout: /*addr*/ [predicate] OPCODE operands ;  /* encoding */
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                 /* 0x00000a0000017a02 */
        /*0010*/                   S2R R0, SR_TID.X ;                     /* 0x0000000000007919 */
        /*0020*/                   LDS.U8 R2, [R0] ;                      /* 0x0000000000027984 */
        /*0030*/                   LOP3.LUT R3, R2, 0xf, RZ, 0xc0, !PT ;  /* 0x0000000f02037812 */
        /*0040*/                   PRMT R4, R3, 0x5410, R3 ;              /* 0x0000541003047816 */
        /*0050*/                   HADD2.BF16_V2 R4, R4, -136, -136 ;     /* 0x0000000004047230 */
        /*0060*/                   I2F.BF16 R5, R3 ;                      /* 0x0000000300057306 */
        /*0070*/                   STS.U16 [R0], R5 ;                     /* 0x0000000500007388 */
        /*0080*/               @P0 BRA 0x20 ;                             /* 0xfffffff000000947 */
        /*0090*/                   FADD R6, R6, R7 ;                      /* 0x0000000706067221 */
        /*00a0*/                   BRA 0xa0;                              /* 0xfffffffc00fc7947 */
"""


def test_instruction_mix_counts_the_loop_body_by_pipe():
  mix = aot.instruction_mix(SASS)
  # The loop is 0x20..0x80 (the backward branch to 0x20); the FADD after it and the self-branch are not in it.
  assert mix["ops"] == {"LDS": 1, "LOP3": 1, "PRMT": 1, "HADD2": 1, "I2F": 1, "STS": 1, "BRA": 1}
  assert mix["pipes"] == {"mio": 2, "int": 2, "fp16": 1, "conv": 1, "other": 1}
  assert mix["total"] == 7
  assert aot.instruction_mix(SASS.split("/*0080*/")[0]) == {}  # no backward branch: no loop


def test_issue_model_arithmetic():
  p = plan(1, 8192, 8192, quant.Int4(), BlockConfig(), "gpu")  # bm 16, bn 128, bk 128, split-K 4
  programs = (p.m_pad // p.bm) * (8192 // p.bn) * p.split_k
  mix = {"pipes": {"int": 512, "mio": 64, "fp16": 128}, "total": 800}
  sm = aot.SMS[90]
  md = aot.issue_model(mix, plan_=p, k=8192, n=8192, m=1, programs=programs, num_warps=4, nbytes=33_554_432, sm=sm)
  # Per chunk: 4 warps x 512 int instructions at 2 per clock = 1024 clocks, the largest pipe (issue: 800 x 4 / 4).
  assert md.clocks_per_chunk["int"] == 1024 and md.clocks_per_chunk["issue"] == 800 and md.bound == "int"
  chunks_per_sm = programs * (8192 // p.split_k // p.bk) / 132
  assert md.t_issue_us == pytest.approx(chunks_per_sm * 1024 / 1980)
  assert md.t_hbm_us == pytest.approx(33_554_432 / 4.8e6)
  weights_per_thread = 128 * 128 / 128  # bk x bn over 4 warps of 32
  assert md.per_weight["int"] == pytest.approx(512 / weights_per_thread)
  assert md.hbm_fraction == pytest.approx(md.t_hbm_us / md.t_issue_us)
  assert aot.issue_model({}, plan_=p, k=8192, n=8192, m=1, programs=programs, num_warps=4, nbytes=1, sm=sm) is None
