"""RDNA3 (gfx11) opcode numbers per encoding, as listed in AMD's "RDNA3 Instruction Set Architecture" reference guide
(chapter 16, microcode formats). Only the instructions the emulator knows are listed; tests check every entry against
llvm-objdump-19's disassembly of the same bits. VOP3 reuses the VOP1/VOP2/VOPC opcodes at offsets 384/256/0."""
from __future__ import annotations


def _table(text: str) -> dict[int, str]:
  return {int(op): name for op, name in (item.split(":") for item in text.split())}


SOP2 = _table("""0:s_add_u32 1:s_sub_u32 2:s_add_i32 3:s_sub_i32 4:s_addc_u32 5:s_subb_u32 6:s_absdiff_i32 8:s_lshl_b32 9:s_lshl_b64
10:s_lshr_b32 11:s_lshr_b64 12:s_ashr_i32 13:s_ashr_i64 14:s_lshl1_add_u32 15:s_lshl2_add_u32 16:s_lshl3_add_u32 17:s_lshl4_add_u32
18:s_min_i32 19:s_min_u32 20:s_max_i32 21:s_max_u32 22:s_and_b32 23:s_and_b64 24:s_or_b32 25:s_or_b64 26:s_xor_b32 27:s_xor_b64
28:s_nand_b32 29:s_nand_b64 30:s_nor_b32 31:s_nor_b64 32:s_xnor_b32 33:s_xnor_b64 34:s_and_not1_b32 35:s_and_not1_b64
36:s_or_not1_b32 37:s_or_not1_b64 38:s_bfe_u32 39:s_bfe_i32 40:s_bfe_u64 41:s_bfe_i64 42:s_bfm_b32 43:s_bfm_b64 44:s_mul_i32
45:s_mul_hi_u32 46:s_mul_hi_i32 48:s_cselect_b32 49:s_cselect_b64 50:s_pack_ll_b32_b16 51:s_pack_lh_b32_b16 52:s_pack_hh_b32_b16
53:s_pack_hl_b32_b16""")

SOPK = _table("""0:s_movk_i32 1:s_version 2:s_cmovk_i32 3:s_cmpk_eq_i32 4:s_cmpk_lg_i32 5:s_cmpk_gt_i32 6:s_cmpk_ge_i32 7:s_cmpk_lt_i32
8:s_cmpk_le_i32 9:s_cmpk_eq_u32 10:s_cmpk_lg_u32 11:s_cmpk_gt_u32 12:s_cmpk_ge_u32 13:s_cmpk_lt_u32 14:s_cmpk_le_u32 15:s_addk_i32
16:s_mulk_i32 17:s_getreg_b32 18:s_setreg_b32 24:s_waitcnt_vscnt 25:s_waitcnt_vmcnt 26:s_waitcnt_expcnt 27:s_waitcnt_lgkmcnt""")

SOP1 = _table("""0:s_mov_b32 1:s_mov_b64 2:s_cmov_b32 3:s_cmov_b64 4:s_brev_b32 5:s_brev_b64 8:s_ctz_i32_b32 9:s_ctz_i32_b64
10:s_clz_i32_u32 11:s_clz_i32_u64 12:s_cls_i32 13:s_cls_i32_i64 14:s_sext_i32_i8 15:s_sext_i32_i16 16:s_bitset0_b32 17:s_bitset0_b64
18:s_bitset1_b32 19:s_bitset1_b64 21:s_abs_i32 22:s_bcnt0_i32_b32 23:s_bcnt0_i32_b64 24:s_bcnt1_i32_b32 25:s_bcnt1_i32_b64 30:s_not_b32
31:s_not_b64 32:s_and_saveexec_b32 34:s_or_saveexec_b32 36:s_xor_saveexec_b32 38:s_nand_saveexec_b32 40:s_nor_saveexec_b32
42:s_xnor_saveexec_b32 44:s_and_not0_saveexec_b32 46:s_or_not0_saveexec_b32 48:s_and_not1_saveexec_b32 50:s_or_not1_saveexec_b32
52:s_and_not0_wrexec_b32 54:s_and_not1_wrexec_b32 71:s_getpc_b64 72:s_setpc_b64 73:s_swappc_b64""")

SOPC = _table("""0:s_cmp_eq_i32 1:s_cmp_lg_i32 2:s_cmp_gt_i32 3:s_cmp_ge_i32 4:s_cmp_lt_i32 5:s_cmp_le_i32 6:s_cmp_eq_u32 7:s_cmp_lg_u32
8:s_cmp_gt_u32 9:s_cmp_ge_u32 10:s_cmp_lt_u32 11:s_cmp_le_u32 12:s_bitcmp0_b32 13:s_bitcmp1_b32 14:s_bitcmp0_b64 15:s_bitcmp1_b64
16:s_cmp_eq_u64 17:s_cmp_lg_u64""")

SOPP = _table("""0:s_nop 1:s_setkill 2:s_sethalt 3:s_sleep 4:s_set_inst_prefetch_distance 5:s_clause 7:s_delay_alu 8:s_waitcnt_depctr
9:s_waitcnt 10:s_wait_idle 11:s_wait_event 16:s_trap 17:s_round_mode 18:s_denorm_mode 31:s_code_end 32:s_branch 33:s_cbranch_scc0
34:s_cbranch_scc1 35:s_cbranch_vccz 36:s_cbranch_vccnz 37:s_cbranch_execz 38:s_cbranch_execnz 48:s_endpgm 53:s_setprio 54:s_sendmsg
60:s_icache_inv 61:s_barrier""")

SMEM = _table("0:s_load_b32 1:s_load_b64 2:s_load_b128 3:s_load_b256 4:s_load_b512 32:s_gl1_inv 33:s_dcache_inv")

VOP1 = _table("""0:v_nop 1:v_mov_b32 2:v_readfirstlane_b32 3:v_cvt_i32_f64 4:v_cvt_f64_i32 5:v_cvt_f32_i32 6:v_cvt_f32_u32 7:v_cvt_u32_f32
8:v_cvt_i32_f32 10:v_cvt_f16_f32 11:v_cvt_f32_f16 12:v_cvt_nearest_i32_f32 13:v_cvt_floor_i32_f32 15:v_cvt_f32_f64 16:v_cvt_f64_f32
17:v_cvt_f32_ubyte0 18:v_cvt_f32_ubyte1 19:v_cvt_f32_ubyte2 20:v_cvt_f32_ubyte3 21:v_cvt_u32_f64 22:v_cvt_f64_u32 23:v_trunc_f64
24:v_ceil_f64 25:v_rndne_f64 26:v_floor_f64 28:v_mov_b16 32:v_fract_f32 33:v_trunc_f32 34:v_ceil_f32 35:v_rndne_f32 36:v_floor_f32
37:v_exp_f32 39:v_log_f32 42:v_rcp_f32 43:v_rcp_iflag_f32 46:v_rsq_f32 47:v_rcp_f64 49:v_rsq_f64 51:v_sqrt_f32 52:v_sqrt_f64
53:v_sin_f32 54:v_cos_f32 55:v_not_b32 56:v_bfrev_b32 57:v_clz_i32_u32 58:v_ctz_i32_b32 59:v_cls_i32 60:v_frexp_exp_i32_f64
61:v_frexp_mant_f64 62:v_fract_f64 63:v_frexp_exp_i32_f32 64:v_frexp_mant_f32 80:v_cvt_f16_u16 81:v_cvt_f16_i16 82:v_cvt_u16_f16
83:v_cvt_i16_f16 84:v_rcp_f16 85:v_sqrt_f16 86:v_rsq_f16 87:v_log_f16 88:v_exp_f16 89:v_frexp_mant_f16 90:v_frexp_exp_i16_f16
91:v_floor_f16 92:v_ceil_f16 93:v_trunc_f16 94:v_rndne_f16 95:v_fract_f16 96:v_sin_f16 97:v_cos_f16 101:v_swap_b32 105:v_not_b16
106:v_cvt_i32_i16 107:v_cvt_u32_u16""")

VOP2 = _table("""1:v_cndmask_b32 2:v_dot2acc_f32_f16 3:v_add_f32 4:v_sub_f32 5:v_subrev_f32 8:v_mul_f32 9:v_mul_i32_i24 10:v_mul_hi_i32_i24
11:v_mul_u32_u24 12:v_mul_hi_u32_u24 15:v_min_f32 16:v_max_f32 17:v_min_i32 18:v_max_i32 19:v_min_u32 20:v_max_u32 24:v_lshlrev_b32
25:v_lshrrev_b32 26:v_ashrrev_i32 27:v_and_b32 28:v_or_b32 29:v_xor_b32 30:v_xnor_b32 32:v_add_co_ci_u32 33:v_sub_co_ci_u32
34:v_subrev_co_ci_u32 37:v_add_nc_u32 38:v_sub_nc_u32 39:v_subrev_nc_u32 43:v_fmac_f32 44:v_fmamk_f32 45:v_fmaak_f32
47:v_cvt_pk_rtz_f16_f32 50:v_add_f16 51:v_sub_f16 52:v_subrev_f16 53:v_mul_f16 54:v_fmac_f16 55:v_fmamk_f16 56:v_fmaak_f16
57:v_max_f16 58:v_min_f16 59:v_ldexp_f16 60:v_pk_fmac_f16""")

_CMP_F = "f lt eq le gt lg ge o u nge nlg ngt nle neq nlt t".split()
_CMP_I = "f lt eq le gt ne ge t".split()


def _vopc() -> dict[int, str]:
  t: dict[int, str] = {}
  for x, base in (("", 0), ("x", 128)):
    for i, ty in enumerate(("f16", "f32", "f64")):
      t.update({base + 16 * i + j: f"v_cmp{x}_{c}_{ty}" for j, c in enumerate(_CMP_F)})
    for i, ty in enumerate(("i16", "u16")):  # the 16-bit integer compares have no f/t forms
      t.update({base + 48 + 8 * i + j: f"v_cmp{x}_{c}_{ty}" for j, c in enumerate(_CMP_I) if c not in ("f", "t")})
    for i, ty in enumerate(("i32", "u32", "i64", "u64")):
      t.update({base + 64 + 8 * i + j: f"v_cmp{x}_{c}_{ty}" for j, c in enumerate(_CMP_I)})
    t.update({base + 125: f"v_cmp{x}_class_f16", base + 126: f"v_cmp{x}_class_f32", base + 127: f"v_cmp{x}_class_f64"})
  return t


VOPC = _vopc()

VOP3_ONLY = _table("""522:v_mad_i32_i24 523:v_mad_u32_u24 528:v_bfe_u32 529:v_bfe_i32 530:v_bfi_b32 531:v_fma_f32 532:v_fma_f64
534:v_alignbit_b32 535:v_alignbyte_b32 537:v_min3_f32 538:v_min3_i32 539:v_min3_u32 540:v_max3_f32 541:v_max3_i32 542:v_max3_u32
543:v_med3_f32 544:v_med3_i32 545:v_med3_u32 549:v_sad_u32 551:v_div_fixup_f32 552:v_div_fixup_f64 567:v_div_fmas_f32
568:v_div_fmas_f64 576:v_xor3_b32 577:v_mad_u16 580:v_perm_b32 581:v_xad_u32 582:v_lshl_add_u32 583:v_add_lshl_u32 584:v_fma_f16
585:v_min3_f16 586:v_min3_i16 587:v_min3_u16 588:v_max3_f16 589:v_max3_i16 590:v_max3_u16 591:v_med3_f16 592:v_med3_i16 593:v_med3_u16
595:v_mad_i16 596:v_div_fixup_f16 597:v_add3_u32 598:v_lshl_or_b32 599:v_and_or_b32 600:v_or3_b32 601:v_mad_u32_u16 602:v_mad_i32_i16
603:v_permlane16_b32 604:v_permlanex16_b32
605:v_cndmask_b16 606:v_maxmin_f32 607:v_minmax_f32 608:v_maxmin_f16 609:v_minmax_f16 610:v_maxmin_u32 611:v_minmax_u32 612:v_maxmin_i32
613:v_minmax_i32 764:v_div_scale_f32 765:v_div_scale_f64 766:v_mad_u64_u32 767:v_mad_i64_i32 768:v_add_co_u32 769:v_sub_co_u32
770:v_subrev_co_u32 771:v_add_nc_u16 772:v_sub_nc_u16 773:v_mul_lo_u16 774:v_cvt_pk_i16_f32 775:v_cvt_pk_u16_f32 777:v_max_u16
778:v_max_i16 779:v_min_u16 780:v_min_i16 781:v_add_nc_i16 782:v_sub_nc_i16 785:v_pack_b32_f16 796:v_ldexp_f32 797:v_bfm_b32
798:v_bcnt_u32_b32 799:v_mbcnt_lo_u32_b32 800:v_mbcnt_hi_u32_b32 803:v_cvt_pk_u16_u32 804:v_cvt_pk_i16_i32 805:v_sub_nc_i32
806:v_add_nc_i32 807:v_add_f64 808:v_mul_f64 809:v_min_f64 810:v_max_f64 811:v_ldexp_f64 812:v_mul_lo_u32 813:v_mul_hi_u32
814:v_mul_hi_i32 824:v_lshlrev_b16 825:v_lshrrev_b16 826:v_ashrrev_i16 828:v_lshlrev_b64 829:v_lshrrev_b64 830:v_ashrrev_i64
864:v_readlane_b32 865:v_writelane_b32 866:v_and_b16 867:v_or_b16 868:v_xor_b16""")

VOP3 = {**VOPC, **{256 + k: v for k, v in VOP2.items() if v not in ("v_fmamk_f32", "v_fmaak_f32", "v_fmamk_f16", "v_fmaak_f16",
                                                                      "v_pk_fmac_f16", "v_dot2acc_f32_f16")},
        **{384 + k: v for k, v in VOP1.items() if v not in ("v_swap_b32", "v_nop", "v_readfirstlane_b32", "v_mov_b16")}, **VOP3_ONLY}
# VOP3 encodings whose bits [14:8] are a scalar destination (carry out / VCC-like result) instead of abs/opsel/clamp
VOP3SD = {288, 289, 290, 764, 765, 766, 767, 768, 769, 770}

VOP3P = _table("""0:v_pk_mad_i16 1:v_pk_mul_lo_u16 2:v_pk_add_i16 3:v_pk_sub_i16 4:v_pk_lshlrev_b16 5:v_pk_lshrrev_b16 6:v_pk_ashrrev_i16
7:v_pk_max_i16 8:v_pk_min_i16 9:v_pk_mad_u16 10:v_pk_add_u16 11:v_pk_sub_u16 12:v_pk_max_u16 13:v_pk_min_u16 14:v_pk_fma_f16
15:v_pk_add_f16 16:v_pk_mul_f16 17:v_pk_min_f16 18:v_pk_max_f16 19:v_dot2_f32_f16 32:v_fma_mix_f32 33:v_fma_mixlo_f16
34:v_fma_mixhi_f16 64:v_wmma_f32_16x16x16_f16 65:v_wmma_f32_16x16x16_bf16 66:v_wmma_f16_16x16x16_f16 67:v_wmma_bf16_16x16x16_bf16
68:v_wmma_i32_16x16x16_iu8 69:v_wmma_i32_16x16x16_iu4""")

VOPD_X = _table("""0:v_dual_fmac_f32 1:v_dual_fmaak_f32 2:v_dual_fmamk_f32 3:v_dual_mul_f32 4:v_dual_add_f32 5:v_dual_sub_f32
6:v_dual_subrev_f32 8:v_dual_mov_b32 9:v_dual_cndmask_b32 10:v_dual_max_f32 11:v_dual_min_f32""")
VOPD_Y = {**VOPD_X, **_table("16:v_dual_add_nc_u32 17:v_dual_lshlrev_b32 18:v_dual_and_b32")}

DS = _table("""0:ds_add_u32 1:ds_sub_u32 5:ds_min_i32 6:ds_max_i32 7:ds_min_u32 8:ds_max_u32 9:ds_and_b32 10:ds_or_b32 11:ds_xor_b32
13:ds_store_b32 14:ds_store_2addr_b32 15:ds_store_2addr_stride64_b32 18:ds_min_f32 19:ds_max_f32 21:ds_add_f32 30:ds_store_b8
31:ds_store_b16 32:ds_add_rtn_u32 53:ds_swizzle_b32 54:ds_load_b32 55:ds_load_2addr_b32 56:ds_load_2addr_stride64_b32 57:ds_load_i8 58:ds_load_u8
59:ds_load_i16 60:ds_load_u16 77:ds_store_b64 78:ds_store_2addr_b64 79:ds_store_2addr_stride64_b64 118:ds_load_b64 119:ds_load_2addr_b64
120:ds_load_2addr_stride64_b64 160:ds_store_b8_d16_hi 161:ds_store_b16_d16_hi 162:ds_load_u8_d16 163:ds_load_u8_d16_hi 164:ds_load_i8_d16
165:ds_load_i8_d16_hi 166:ds_load_u16_d16 167:ds_load_u16_d16_hi 178:ds_permute_b32 179:ds_bpermute_b32 222:ds_store_b96
223:ds_store_b128 254:ds_load_b96 255:ds_load_b128""")

_MEM = """16:load_u8 17:load_i8 18:load_u16 19:load_i16 20:load_b32 21:load_b64 22:load_b96 23:load_b128 24:store_b8 25:store_b16
26:store_b32 27:store_b64 28:store_b96 29:store_b128 30:load_d16_u8 31:load_d16_i8 32:load_d16_b16 33:load_d16_hi_u8 34:load_d16_hi_i8
35:load_d16_hi_b16 36:store_d16_hi_b8 37:store_d16_hi_b16"""
_ATOMIC = """51:atomic_swap_b32 52:atomic_cmpswap_b32 53:atomic_add_u32 54:atomic_sub_u32 56:atomic_min_i32 57:atomic_min_u32
58:atomic_max_i32 59:atomic_max_u32 60:atomic_and_b32 61:atomic_or_b32 62:atomic_xor_b32 67:atomic_add_u64 86:atomic_add_f32"""
FLAT = {k: "flat_" + v for k, v in _table(_MEM + " " + _ATOMIC).items()}
GLOBAL = {k: "global_" + v for k, v in _table(_MEM + " " + _ATOMIC).items()}
SCRATCH = {k: "scratch_" + v for k, v in _table(_MEM).items()}
MUBUF = _table("43:buffer_gl0_inv 44:buffer_gl1_inv")

# mnemonics that have no e32/e64 twin, so llvm prints them without the encoding suffix
NO_SUFFIX = {"v_readfirstlane_b32", "v_swap_b32", "v_fmamk_f32", "v_fmaak_f32", "v_fmamk_f16", "v_fmaak_f16", "v_dot2acc_f32_f16",
             "v_pk_fmac_f16", "v_nop"}
