"""Break one line of a backward (or of a kernel the backwards use) on purpose and confirm the test that guards it
fails (or, for the last rows, a data-parallel rule). Run from anywhere: python tests/mutation_check.py (every row must say CAUGHT; exit status 1 otherwise);
python tests/mutation_check.py WORD... runs only the rows whose test name or mutated file contains a WORD.

It mutates a scratch copy of minigpt/, tests/ and native/ (numba's cache files included, so only the mutated
module recompiles; a C row rebuilds the copy's library, before the test and after the restore), never the working
tree: other processes running the tests meanwhile see the real code.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

L, MODEL = "minigpt/layers.py", "minigpt/model.py"
SPEC, NK = "minigpt/backends/numpy_ops.py", "minigpt/backends/numba_kernels.py"
BK = "minigpt/backends/interface.py"
TL, TM, TO = "tests/test_layers.py", "tests/test_model.py", "tests/test_ops.py"
TRAIN, DATA, TD = "minigpt/train.py", "minigpt/data.py", "tests/test_distributed.py"
TT, OPT, TMU = "tests/test_train.py", "minigpt/optim.py", "tests/test_muon.py"
TB, TE = "tests/test_bf16.py", "tests/test_native_emulated.py"
EMU = f"{TE}::test_native_tests_pass_on_the_emulated_avx512_paths"
CAUSAL = f"{TO}::test_causal_products_are_the_plain_products"
ISA = "tests/test_native_isa.py::test_matmul_every_path_matches_float64"   # every path this CPU runs, forced
GELU_EP = "tests/test_native_isa.py::test_matmul_gelu_is_the_product_then_gelu_every_path"
EPI = "tests/test_native_isa.py::test_matmul_mul_and_add_are_the_product_then_the_op_every_path"
SUBN = f"{TB}::test_bf16_products_round_subnormal_operands_to_zero_on_native"
# a kernel broken badly enough that numba's own smoke test (numba_ops.backend) refuses it: the op tests then skip
# numba, and this test fails instead
SMOKE = "tests/test_backends.py::test_a_backend_that_loads_here_passes_its_own_smoke_test"

# (file, exact text (must occur once), replacement, the test that must fail)
M = [
    # layers.py and model.py: the backwards themselves, caught by finite differences (numpy backend, float64)
    (L, "db += flat(dout).sum(axis=0)", "db += 0.99 * flat(dout).sum(axis=0)", f"{TL}::test_linear_grad"),
    (L, "ops.matmul(flat(x), flat(dout), ta=True, out=dw, acc=True)",
        "ops.matmul(flat(x), 0.5 * flat(dout), ta=True, out=dw, acc=True)", f"{TL}::test_linear_grad"),
    (L, "ops.matmul(flat(x), flat(dout), ta=True, out=dw, acc=True)",
        "ops.matmul(flat(x), flat(dout), ta=True, out=dw, acc=False)", f"{TL}::test_backward_accumulates"),
    (L, "dwpe[:idx.shape[1]] += dout.sum(axis=0)", "dwpe[:idx.shape[1]] += dout[0]", f"{TL}::test_embedding_grad"),
    (BK, 'self.bmm(attd, dy, ta=True, out=dv, causal="a")',
        'self.bmm(att, dy, ta=True, out=dv, causal="a")', f"{TL}::test_attention_grad"),
    (BK, 'self.bmm(datt, q, ta=True, out=dk, causal="a")', 'self.bmm(datt, q, ta=True, out=dk, causal="a"); dk *= 0.5',
        f"{TL}::test_attention_grad"),
    (BK, "self.dropout(datt, *drop, out=datt)", "datt", f"{TL}::test_attention_grad"),
    (BK, 'att = self.dropout(att, *drop, out=self._tmp("attd", att.shape, att.dtype))',
        'self.dropout(att, *drop, out=self._tmp("attd", att.shape, att.dtype))',
        f"{TL}::test_attention_dropout_multiplies_v_by_the_dropped_probabilities"),
    (L, "yh, scale, start, drop)", "yh, scale, 0, drop)",
        f"{TL}::test_attention_with_a_kv_cache_equals_the_full_pass"),
    (L, "scale / targets.size, flat(dlogits)", "1.0 / targets.size, flat(dlogits)", f"{TL}::test_cross_entropy_grad"),
    (MODEL, "a.ln2_mean, a.ln2_rstd, acc=True)", "a.ln2_mean, a.ln2_rstd, acc=False)", f"{TL}::test_block_grad"),
    (MODEL, 'b("attn.c_proj.bias"), res=x, drop=drop)', 'b("attn.c_proj.bias"), drop=drop)', f"{TL}::test_block_grad"),
    (MODEL, 'p["mlp.c_proj.weight"], dact=a.fc_dact)', 'p["mlp.c_proj.weight"])', f"{TL}::test_block_grad"),
    (L, "ops.matmul_mul(flat(dout), w, flat(dact), out=flat(dx), tb=True)", "ops.matmul(flat(dout), w, tb=True, "
        "out=flat(dx))", f"{TL}::test_block_grad"),
    (BK, "return np.multiply(out, scale, out=out)", "return out", f"{TL}::test_block_grad"),
    (BK, "return np.add(res, out, out=out)", "return out", f"{TL}::test_block_grad"),
    (SPEC, "dx += dxhat", "dx[...] = dxhat", f"{TL}::test_block_grad"),
    (NK, "dx[i, j] = dx[i, j] + v if acc else v", "dx[i, j] = v", f"{TO}::test_in_place_forms_match"),
    ("native/mgk_ops.c", "for (long long j = 0; j < C; j++) dx[j] += r * (dy[j]",
        "for (long long j = 0; j < C; j++) dx[j] = r * (dy[j]", f"{TO}::test_in_place_forms_match"),
    (MODEL, "dy = L.dropout(ops, d.dproj, dx, self.p_drop, a.drop_seeds[MLP_OUT]) if dropped else dx", "dy = dx",
        f"{TL}::test_block_grad"),
    (MODEL, 'ops.matmul(flat(dlogits), flat(x), ta=True, out=self._grads["wte.weight"], acc=True)', "None",
        f"{TM}::test_gpt_grad_every_parameter"),
    (MODEL, 'ops.matmul(flat(dlogits), flat(x), ta=True, out=self._grads["wte.weight"], acc=True)',
        'ops.matmul(flat(dlogits), flat(x), ta=True, out=self._grads["wte.weight"], acc=False)',
        f"{TM}::test_gpt_backward_accumulates"),
    (MODEL, 'L.embedding_backward(ops, g["wte.weight"], g["wpe.weight"], dx, self.idx)', "pass",
        f"{TM}::test_gpt_grad_every_parameter"),
    (MODEL, "L.dropout(ops, dx, dx, self.config.dropout, a.emb_seed[0])", "pass",
        f"{TM}::test_gpt_grad_every_parameter"),
    # the speedrun options (issue 24): ReLU^2, QK-norm, the logit soft-cap, zero-initialised projections
    (L, "    r *= 2.0", "    r *= 1.0", f"{TL}::test_linear_activation_grad"),
    (L, "dxhat[:, :, s] -= np.multiply(xhat[:, :, s], dot[..., None], out=tmp)", "pass",
        f"{TL}::test_qk_norm_grad"),
    (L, "dxhat[:, :, s] *= rstd[:, :, s, :, None]", "dxhat[:, :, s] *= 1.0", f"{TL}::test_qk_norm_grad"),
    (L, "return np.multiply(dout, dcap, out=dz)", "return np.copyto(dz, dout) or dz", f"{TL}::test_softcap_grad"),
    (MODEL, "act = L.linear_relu2_forward if self.relu2 else L.linear_gelu_forward", "act = L.linear_gelu_forward",
        f"{TM}::test_gpt_relu2_mlp_is_relu_squared"),
    (MODEL, "L.qk_norm_backward(d.dqkv, d.datty, a.qkv, a.qk_rstd, self.n_head)", "pass", f"{TL}::test_block_grad"),
    (MODEL, "L.softcap_backward(d.dlogits, d.dlogits, a.logits_dcap)", "pass",
        f"{TM}::test_gpt_grad_every_parameter_with_the_speedrun_options"),
    (MODEL, "                    p[...] = 0.0", "                    pass",
        f"{TM}::test_gpt_zero_init_proj_zeroes_only_the_output_projections"),
    ("minigpt/hf.py", "    check_expressible(mc, ckpt)", "    pass",
        "tests/test_export_hf.py::test_export_refuses_options_gpt2_cannot_express"),
    ("minigpt/hf.py", "for name in set(EXPORTED) - set(written):", "for name in ():",
        "tests/test_export_hf.py::test_export_force_leaves_only_this_models_files"),
    # numpy_ops.py: the specification the layers run on in the finite-difference tests
    (SPEC, "x2 *= 6 * GELU_C * GELU_A", "x2 *= 2 * GELU_C * GELU_A", f"{TL}::test_gelu_grad"),
    (SPEC, "db += dx.reshape(-1, dx.shape[-1]).sum(0)", "db += 0.5 * dx.reshape(-1, dx.shape[-1]).sum(0)",
        f"{TL}::test_linear_activation_grad"),
    (SPEC, "np.add.at(dW.reshape(-1), flat.reshape(-1), dout.reshape(-1))",
        "dW.reshape(-1)[flat.reshape(-1)] += dout.reshape(-1)", f"{TL}::test_embedding_grad"),
    (SPEC, "dxhat -= dxhat.mean(-1, keepdims=True)", "dxhat -= 0.0",
        f"{TL}::test_layernorm_grad"),
    (SPEC, "datt *= np.multiply(att, float(scale), out=tmp)", "datt *= att", f"{TL}::test_attention_grad"),
    (BK, "np.triu(np.ones((T, Tk), bool), k=start + 1)", "np.triu(np.ones((T, Tk), bool), k=start + 2)",
        f"{TL}::test_attention_is_causal"),
    (SPEC, "dlogits[np.arange(targets.size), targets] -= scale", "dlogits[np.arange(targets.size), targets] -= 1.0",
        f"{TL}::test_cross_entropy_grad"),
    # the numba kernels (numba and native backends), caught by test_ops.py against the spec
    (NK, "g[r, j] += dout[n, j]", "g[r, j] = dout[n, j]", f"{TO}::test_embedding_backward_matches_loop"),
    (NK, "v = ri * (a[j] - ma - (x[i, j] - mi) * ri * mc)", "v = ri * (a[j] - (x[i, j] - mi) * ri * mc)",
        f"{TO}::test_layernorm_matches_spec"),
    (NK, "dw[j] += dy[i, j] * ((x[i, j] - mi) * ri)", "dw[j] += dy[i, j] * (x[i, j] - mi)",
        f"{TO}::test_layernorm_matches_spec"),
    (NK, "r[j] = scale * a[j] * (r[j] - d)", "r[j] = a[j] * (r[j] - d)", f"{TO}::test_causal_softmax_matches_spec"),
    (NK, "r, n = att[l, i], min(start + i + 1, Tk)", "r, n = att[l, i], min(start + i, Tk)", SMOKE),
    (NK, "GELU_C * (1.0 + 3 * GELU_A * x * x)", "GELU_C * (1.0 + GELU_A * x * x)", f"{TO}::test_gelu_matches_spec"),
    (NK, "db[j] += dx[i, j]", "db[j] += 0.5 * dx[i, j]", f"{TO}::test_gelu_matches_spec"),
    (NK, "d[targets[i]] -= scale", "d[targets[i]] -= 1.0", f"{TO}::test_cross_entropy_matches_spec"),
    (NK, "m[i] = b1 * m[i] + c1 * gi", "m[i] = b1 * m[i] + gi", f"{TO}::test_adamw_matches_spec"),
    (NK, "a, rb, decay = f(lr / bc1),", "a, rb, decay = f(1.0003 * lr / bc1),", f"{TO}::test_adamw_matches_spec"),
    (NK, "p = p * r * r + r + F32(1.0)", "p = p * r * r + r", SMOKE),
    # dropout's masks: the spec's keys (two seeds would share a mask's structure), numba's and C's hash, the
    # layer's fresh seed per mask
    (SPEC, "k2 = mix32(np.uint32(seed >> 32) ^ mix32(k1 ^ GOLDEN, one), one)",
        "k2 = mix32(np.uint32(seed >> 32) ^ k1, one)",
        f"{TO}::test_dropout_is_a_fair_fresh_draw"),
    (NK, "u = _mix32(_mix32(np.uint64(i) ^ k1) ^ k2)", "u = _mix32(np.uint64(i) ^ k1 ^ k2)",
        f"{TO}::test_dropout_matches_spec"),
    ("native/mgk_ops.c", "return x * pick(mix32(mix32(i ^ k1) ^ k2) >> 8 >= keep_from, scale, 0.0f);",
        "return x * pick(mix32(mix32(i ^ k1) ^ k1) >> 8 >= keep_from, scale, 0.0f);",
        "tests/test_native_ops.py::test_dropout_fast_matches_reference_and_spec"),
    (L, "    return int(rng.integers(2**64, dtype=np.uint64))", "    return 7",
        f"{TL}::test_dropout_is_inverted_and_fresh"),
    # the products' accumulation (numpy and numba), numba's causal zeroing, and the views' copy-back
    (SPEC, "        out += np.matmul(", "        out[...] = np.matmul(", f"{TL}::test_backward_accumulates"),
    ("minigpt/backends/numba_ops.py", "NK.zero_future(c.inout(out)", "(c.inout(out)", CAUSAL),
    (BK, "            np.copyto(x, s)", "            pass",
        f"{TO}::test_bmm_on_views_matches_float64"),
    # the arguments Ops checks once for every backend (the numba and C kernels trust them)
    (BK, 'check_ids("embedding_backward", idx, V, "token ids")', "pass",
        f"{TO}::test_every_backend_refuses_bad_arguments_alike"),
    (BK, 'check_shapes("adamw", (p.shape, g, m, v))', "pass", f"{TO}::test_every_backend_refuses_bad_arguments_alike"),
    # the whole-split evaluation and the time budget's schedule
    (TRAIN, "if tail and world.root:", "if False:", f"{TT}::test_whole_split_loss_counts_every_target_once"),
    # training on a directory of token shards: the capped final score, the tokenizer of a folder of llm.c's shards
    (TRAIN, 'val = run.data.ids("val", run.cfg.val_tokens or None)', 'val = run.data.ids("val")',
        "tests/test_train_shards.py::test_the_final_score_takes_at_most_val_tokens_and_says_how_many"),
    (TRAIN, "tok = tokenizer_from_path(cfg.tokenizer)", "tok = None",
        "tests/test_train_shards.py::test_llmc_shards_written_by_hand_train_and_resume_bit_identically"),
    (TRAIN, "schedule = it if not cfg.max_time else", "schedule = it if True else",
        f"{TT}::test_max_time_ends_the_run_and_lays_the_schedule_over_the_budget"),
    # Muon: the Nesterov look-ahead, the shape scale, one Newton-Schulz product
    (OPT, "if self.nesterov:", "if False:",
        f"{TMU}::test_muon_step_matches_float64_reference_and_adamw"),
    (OPT, "p -= (lr_muon * scale) * o", "p -= lr_muon * o",
        f"{TMU}::test_muon_step_matches_float64_reference_and_adamw"),
    # --muon_split_qkv: c_attn's q, k, v blocks apart, each scaled as a square matrix, turned on by training
    (OPT, "blocks = U.reshape(L, rows, parts, cols).transpose(0, 2, 1, 3).reshape(L * parts, rows, cols)",
        "blocks = U.reshape(L * parts, rows, cols).copy()",
        f"{TMU}::test_muon_split_qkv_orthogonalises_q_k_v_each_on_its_own"),
    (OPT, "scale = muon_scale((shape[0], shape[1] // parts))", "scale = muon_scale(shape)",
        f"{TMU}::test_muon_split_qkv_orthogonalises_q_k_v_each_on_its_own"),
    (TRAIN, "split_qkv=cfg.muon_split_qkv, ops=model.ops)", "ops=model.ops)",
        f"{TMU}::test_muon_split_qkv_orthogonalises_q_k_v_each_on_its_own"),
    (OPT, "ops.bmm(B, X, out=Y, acc=True, bf16=bf16)", "ops.bmm(B, X, out=Y, acc=False, bf16=bf16)",
        f"{TMU}::test_newton_schulz_matches_float64_reference"),
    # Muon's Newton-Schulz in bf16: one product's operands left float32; a bf16 model's Muon left float32
    (OPT, "ops.bmm(A, A, out=B, bf16=bf16)", "ops.bmm(A, A, out=B)",
        f"{TMU}::test_newton_schulz_in_bf16_matches_its_emulation"),
    (TRAIN, "momentum_warmup=cfg.muon_momentum_warmup, bf16=model.bf16,", "momentum_warmup=cfg.muon_momentum_warmup,",
        f"{TMU}::test_muon_of_a_bf16_run_orthogonalises_in_bf16"),
    # bf16 products: the rounding's tie rule (numpy spec, C), each backend rounding its operands, the model's backend
    # bound to its precision, and the products reading it
    (SPEC, "r &= 1 ", "r &= 0 ", f"{TB}::test_rounding_matches_the_definition"),
    (SPEC, "a, b = bf16_operands(ops, a, b)", "a, b = bf16_operands(ops, a, b)[0], b",
        f"{TB}::test_bf16_products_round_both_operands_exactly"),
    (MODEL, "self.ops = ops.with_bf16(bf16)", "self.ops = ops.with_bf16(False)",
        f"{TB}::test_products_follow_the_model_that_runs_them"),
    (BK, "bf16 = self.bf16 if bf16 is None else bool(bf16)", "bf16 = bool(bf16)",
        f"{TB}::test_products_follow_the_model_that_runs_them"),
    # LayerNorm backward's one pass: its row blocks, and their sums added into dw
    ("native/mgk_ops.c", "for (long long j = 0; j < C; j++) dw[j] += a.pw[blk * C + j];",
        "for (long long j = 0; j < C; j++) dw[j] = a.pw[blk * C + j];",
        "tests/test_native_ops.py::test_layernorm_fast_matches_reference_and_spec"),
    ("native/mgk_ops.c", "for (long long i = blk * a->block_rows; i < end; i++) {",
        "for (long long i = blk * a->block_rows + 1; i < end; i++) {",
        "tests/test_native_ops.py::test_layernorm_fast_matches_reference_and_spec"),
    ("native/mgk_ops.c", "span(a->blocks, tid, nt, 1, &b0, &b1);", "span(a->blocks - 1, tid, nt, 1, &b0, &b1);",
        "tests/test_native_ops.py::test_same_bits_for_1_and_2_threads"),
    ("native/mgk_ops.c", "for (int j = 0; j < n; j++) sb[j] = db[j0 + j];", "for (int j = 0; j < n; j++) sb[j] = db[j];",
        "tests/test_native_ops.py::test_gelu_matches_reference_and_spec"),
    ("native/mgk_ops.c", "for (int j = 0; j < n; j++) v[j] = x[j] + b[j0 + j];",
        "for (int j = 0; j < n; j++) v[j] = x[j] + b[j];", "tests/test_native_ops.py::test_gelu_matches_reference_and_spec"),
    ("native/mgk.c", "return (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;", "return (u + 0x7fffu) & 0xffff0000u;",
        f"{TB}::test_c_rounding_equals_numpy_bit_for_bit"),
    ("native/mgk_gemm_generic.inc", "if (g->bf16) round_bf16(bp, (long)(nc + GV_NR - 1) / GV_NR * GV_NR * kc);",
        "", f"{TB}::test_bf16_products_round_both_operands_exactly"),
    ("native/mgk_amx.inc", "TILE_DP(2, 5, 6); TILE_DP(3, 5, 7);", "TILE_DP(2, 5, 6); TILE_DP(3, 5, 6);",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    ("native/mgk_amx.inc", "BF16_PAIRS16(b0 + j, b1 + j, row);", "BF16_PAIRS16(b1 + j, b0 + j, row);",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    ("native/mgk_amx.inc", "TILE_LOAD(5, ap + 16 * AMX_LD(kp) + k, AMX_LD(kp) * 2);",
        "TILE_LOAD(5, ap + 16 * AMX_LD(kp), AMX_LD(kp) * 2);",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    ("native/mgk_amx.inc", "BF16_PAIRS8(a, a + g->lda, w + p * 8);", "BF16_PAIRS8(a + g->lda, a, w + p * 8);",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    ("native/mgk_amx.inc", "hi[c] = k + 2 * p + 1 < kc ? a[g->lda + c] : 0.0f;",
        "hi[c] = k + 2 * p + 1 < kc ? a[c] : 0.0f;",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    ("native/mgk_amx_emu.inc", "uint32_t w = bf16_bits_daz(hi[j]) | bf16_bits_daz(lo[j]) >> 16;",
        "uint32_t w = bf16_bits_daz(lo[j]) | bf16_bits_daz(hi[j]) >> 16;",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    # the GELU in a product's epilogue (mgk_gemm_gelu): skipped on a path or loop order, on the wrong columns, or
    # computed in the tiles' flush-to-zero mode
    ("native/mgk_amx.inc", "if (g->ep && pc + KC_DP >= g->K)", "if (g->ep && pc + KC_DP > g->K)",
        "tests/test_bf16.py::test_matmul_gelu_on_the_amx_path"),
    ("native/mgk_amx.inc", "if (g->ep)                                /* the row block is final, and still in L2 */",
        "if (!g->ep)", "tests/test_bf16.py::test_matmul_gelu_on_the_amx_path"),
    ("native/mgk_avx512.inc", "if (g->ep && pc + KB >= g->K)", "if (g->ep && pc + KB > g->K)", GELU_EP),
    ("native/mgk_avx512.inc", "if (g->ep)                                /* the row block is final, and still in L2 */",
        "if (!g->ep)", GELU_EP),
    ("native/mgk_gemm_generic.inc", "if (g->ep && pc + GV_KC >= g->K)", "if (g->ep && pc > g->K)", GELU_EP),
    ("native/mgk.c", "if (g->ep) mgk_epilogue(g, C, 0, g->M, n0, n1);", "", GELU_EP),
    ("native/mgk_ops.c", "gelu_block(i1 - i0, j1 - j0, C + (long long)i0 * g->ldc + j0, g->ldc, g->ep_bias ? g->ep_bias + j0",
        "gelu_block(i1 - i0, j1 - j0, C + (long long)i0 * g->ldc + j0, g->ldc, g->ep_bias ? g->ep_bias", GELU_EP),
    ("native/mgk.c", "_mm_setcsr(g->csr);                        /* the composition's bits", "/* no", GELU_EP),
    # the multiply and the residual add in a product's epilogue (mgk_gemm_mul, mgk_gemm_add)
    ("native/mgk.c", "_mm_setcsr(g->csr);                        /* the composition's bits", "/* no", EPI),
    ("native/mgk_ops.c", "ep_block(EPB_MUL, i1 - i0", "ep_block(EPB_ADD, i1 - i0", EPI),
    ("native/mgk_ops.c", "y[j] = y[j] * d[j];", "y[j] = d[j];", EPI),
    ("native/mgk_ops.c", "y[j] = d[j] + (y[j] + b[j]);", "y[j] = d[j] + y[j];", EPI),
    ("native/mgk_ops.c", "y[j] = d[j] + y[j];               /* x + z */", "y[j] = y[j];", EPI),
    ("native/mgk_ops.c", "(unsigned int)((long long)i0 * g->N + j0)", "(unsigned int)((long long)i0 * g->N)", EPI),
    ("native/mgk_ops.c", "if (b) ep_block(EPB_BIAS,", "if (0) ep_block(EPB_BIAS,", EPI),
    (BK, "self.dropout(out, *drop, out=out)                         # dropout(z + bias)", "None", f"{TL}::test_block_grad"),
    # every fast path rounds a subnormal operand to zero (vcvtneps2bf16's rule): the emulated amx copy, the packs
    # of generic/avx2/avx512 and the few-rows path (BF16_DAZ_VEC; the avx512bf16 packs: the emulated build's row)
    ("native/mgk_amx_emu.inc", "for (int k = 0; k < n; k++) d[k] = (uint16_t)(bf16_bits_daz(a[k]) >> 16);",
        "for (int k = 0; k < n; k++) d[k] = (uint16_t)(bf16_bits(a[k]) >> 16);", SUBN),
    ("native/mgk_amx_emu.inc", "uint32_t w = bf16_bits_daz(hi[j]) | bf16_bits_daz(lo[j]) >> 16;",
        "uint32_t w = bf16_bits(hi[j]) | bf16_bits(lo[j]) >> 16;", SUBN),
    ("native/mgk.c", "        uint32_t r = bf16_bits_daz(p[i]);", "        uint32_t r = bf16_bits(p[i]);", SUBN),
    ("native/mgk.c", "T sub_ = (T)(((u) & 0x7f800000u) == 0);", "T sub_ = (T)((u) != (u));", SUBN),
    ("native/mgk_amx.inc", "memcpy(panel + (k / 2 + p) * 16 + j - 16 * q, t + p * 8, 32);",
        "memcpy(panel + (k / 2 + p) * 16 + j - 16 * q, t + (p ^ 1) * 8, 32);",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    ("native/mgk_amx_emu.inc", "for (int c = 0; c < 8; c++) dst[c * 8 + r] = src[r * lds + c];",
        "for (int c = 0; c < 8; c++) dst[r * 8 + c] = src[r * lds + c];",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    ("native/mgk_amx.inc", "TILE_LOAD(7, bp + AMX_PANEL(kp) + k / 2 * 16, 64);",
        "TILE_LOAD(7, bp + (long)kp * 8 + k / 2 * 16, 64);",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    ("native/mgk.c", "    long d = kc + PANEL_PAD;", "    long d = kc;", ISA),
    ("native/mgk_avx512.inc", "#define MC_AT(ic) (m1 - (ic) < MB ? m1 - (ic) : MB)", "#define MC_AT(ic) (m1 - (ic) < MB ? m1 - (ic) : MC)",
        "tests/test_native_isa.py::test_row_blocks"),
    ("native/mgk_avx512.inc", "for (int ic = m0; ic < m1; ic += MB) {\n                gemm_rows(",
        "for (int ic = m0; ic < m1; ic += MC) {\n                gemm_rows(", "tests/test_native_isa.py::test_row_blocks"),
    ("native/mgk_amx.inc", "ap, bp + b * step, t);", "ap, bp, t);",
        f"{TB}::test_amx_path_blocking_matches_the_emulation"),
    ("native/mgk.c", "*k1 = empty ? *k0 : (*k1 + 31) & ~31;", "*k1 = empty ? *k0 : *k1 & ~31;",
        f"{TB}::test_bf16_causal_products_match_the_emulation"),
    ("native/mgk_amx.inc", "GA(pack_a)(g, A, ic + ir, mr, pc + k0,", "GA(pack_a)(g, A, ic + ir, mr, pc,",
        f"{TB}::test_bf16_causal_products_match_the_emulation"),
    # the fused attention (mgk_attention_fwd/bwd): each step of an item, against the same ops called one by one
    ("native/mgk_attention.c", "softmax_item(a, 1, att, att, a->att.ld);", "softmax_item(a, 1, att, att, a->Tk);",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_attention.c", "mgk_item_block(&a->dkj, ds, q, dk,", "mgk_item_block(&a->dkj, ds, k, dk,",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_attention.c", "int T = a->T, hs = a->dvj.N;\n    for (int l = tid; l < a->L; l += nt) {",
        "int T = a->T, hs = a->dvj.N;\n    for (int l = tid; l < a->L; l += 2 * nt) {",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_attention.c", "            p = item_scratch[1][tid];", "            ;",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_attention.c", "            p = attd;", "            (void)attd;",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_attention.c", "            drop_item(a, l, ds, T, ds, T);", "            ;",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_attention.c", "(unsigned int)l * (unsigned int)a->T * (unsigned int)a->Tk,", "0u,",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_attention.c", "(unsigned int)a->Tk, a->k1,", "(unsigned int)a->T, a->k1,",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_attention.c", "mgk_dropout_rows(a->T, a->Tk, a->start,", "mgk_dropout_rows(a->T, a->Tk, 0,",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_attention.c", "    _mm_setcsr(a->csr);\n#endif\n    mgk_dropout_rows", "#endif\n    mgk_dropout_rows",
        "tests/test_native_isa.py::test_fused_attention_dropout_keeps_subnormal_probabilities_every_path"),
    ("native/mgk_ops.c", "for (int j = m; j < a->cols; j++) y[j] = 0.0f;", ";",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_ops.c", "const float *p = a->att + i * a->lda;", "const float *p = a->att + i * a->ldg;",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    # the fused products leave the future to the softmaxes (mgk_attention.c): each must write every column
    ("native/mgk_ops.c", "for (; j < Tk; j++) r[j] = 0.0f;", ";",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk_ops.c", "for (; j < Tk; j++) g[j] = 0.0f;", ";",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("native/mgk.c", "            zero_future(g, C, m0, m1, n0, n1);", "            ;",
        "tests/test_native_isa.py::test_causal_products_every_path"),
    ("minigpt/backends/native.py", "for x in (q, k, v, att, y)] if _fused(self, q, k, start) else None",
        "for x in (q, k, v, att, y)] if _fused(self, q, k, start) and drop is None else None",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("minigpt/backends/native.py", "and items >= nt and (items % nt == 0 or items >= 4 * nt))", "and items >= 1)",
        "tests/test_native_isa.py::test_fused_attention_is_the_composed_ops_every_path"),
    ("minigpt/backends/native.py", "if any(np.may_share_memory(x, y) for y in inputs):", "if False:",
        "tests/test_kernels.py::test_attention_rejects_bad_arguments_as_its_products_do"),
    # the avx512 and avx512bf16 micro-kernels, caught on any AVX2 CPU by their emulated build
    ("native/mgk_avx512.inc", "if (NV == 2) acc[i][1] = _mm512_fmadd_ps(a, b1, acc[i][1]);",
        "if (NV == 2) acc[i][1] = _mm512_fmadd_ps(a, b0, acc[i][1]);", EMU),
    ("native/mgk_avx512.inc", "kernel_dp_8x16)((k1 - k0 + 1) / 2,", "kernel_dp_8x16)((k1 - k0) / 2,", EMU),
    ("native/mgk_avx512bf16.inc", "float *panel = bp + (long)jp * d;", "float *panel = bp + (long)jp * (kc / 2);", EMU),
    ("native/mgk_avx512bf16.inc", "r[i] = bf16_x16(src + (long)i * lds + k);", "r[i] = _mm256_loadu_ps(src + (long)i * lds + k);",
        EMU),
    ("native/mgk_avx512bf16.inc", "_mm256_storeu_ps(dst + (k / 2 + c + 4) * ldd,", "_mm256_storeu_ps(dst + (k / 2 + c + 3) * ldd,",
        EMU),
    ("native/mgk_avx512bf16.inc", "k = pair_rows8(b + (long)j * g->ldb, g->ldb, panel + j, w, kc);",
        "k = pair_rows8(b + (long)j * g->ldb, g->ldb, panel, w, kc);", EMU),
    ("native/mgk_avx512.inc", "pack_at_pairs(g, A, ic, mc, pc + k0, kc - k0, ap + k0 / 2 * MR, d);",
        "pack_at_pairs(g, A, ic, mc, pc + k0, kc - k0, ap, d);", EMU),
    ("native/mgk_avx512bf16.inc", "bf16_pairs8(s0, s1, row + j);", "bf16_pairs8(s1, s0, row + j);", EMU),
    ("native/mgk_avx512bf16.inc", "float *row = bp + (long)jp * d + (long)p * w;",
        "float *row = bp + (long)jp * d + (long)p * NR;", EMU),
    ("native/mgk_avx512bf16.inc", "bf16_pairs8(r0, r1, ap + (long)ir * d + p * MR);",
        "bf16_pairs8(r1, r0, ap + (long)ir * d + p * MR);", EMU),
    ("native/mgk_avx512bf16.inc", "= {0, 8, 1, 9, 2, 10,", "= {8, 0, 1, 9, 2, 10,", EMU),
    ("native/mgk_avx512_emu.h", "    x = emu_daz(x);\n    memcpy(&u, &x, 4);", "    memcpy(&u, &x, 4);", EMU),
    ("native/mgk.c", "memcpy(ap + ir * d + k * mr, a + ir, sizeof(float) * (size_t)mr);",
        "memcpy(ap + ir * d + k * mr, a + ir + 1, sizeof(float) * (size_t)mr);", ISA),
    ("native/mgk.c", "(((u) + 0x7fffu + (((u) >> 16) & 1u)) & ~(nan_ | sub_))", "(((u) + 0x7fffu) & ~(nan_ | sub_))",
        f"{TB}::test_bf16_products_round_ties_to_even_in_both_operands"),
    ("native/mgk_avx512.inc", "float beta = pc == 0 ? g->beta : 1.0f;                /* later k blocks",
        "float beta = g->beta;                /* later k blocks", EMU),
    ("native/mgk_avx512.inc", "KC_AT(b * KB), ap, bp + b * step);", "KC_AT(b * KB), ap, bp);", EMU),
    ("native/mgk_avx512bf16.inc", "__m512bh b1 = NV == 2 ? (__m512bh)_mm512_loadu_si512(bp + 16) : b0;",
        "__m512bh b1 = NV == 2 ? (__m512bh)_mm512_loadu_si512(bp) : b0;", EMU),
    # the few-rows path (mgk_small.inc, on this CPU's path; AVX-512 by the emulated build): op(B) = B^T tiles and tails
    ("native/mgk_small.inc", "acc[i * nj + q] = SV_FMA(av[i], bv, acc[i * nj + q]);",
        "acc[i * nj] = SV_FMA(av[i], bv, acc[i * nj]);", f"{TO}::test_few_rows_match_float64"),
    ("native/mgk_small.inc", "for (; j < n1; j++) SV(small_nt_tile)", "for (; j + 1 < n1; j++) SV(small_nt_tile)",
        f"{TO}::test_few_rows_match_float64"),
    ("native/mgk_small.inc", "for (int u = 0; u < 4; u++) bv[u] = SV_OPERAND(SV_LD(b + u * g->ldb + j, m));",
        "for (int u = 0; u < 4; u++) bv[u] = SV_OPERAND(SV_LD(b + j, m));", EMU),
    # bf16 products on the few-rows path: each operand rounded as it is read
    ("native/mgk_small.inc", "#define SV_OPERAND(v) (bf ? SV(rnd)(v) : (v))", "#define SV_OPERAND(v) (v)",
        f"{TB}::test_bf16_products_round_ties_to_even_in_both_operands"),
    ("native/mgk_small.inc", "bv[u] = SV_OPERAND(SV_LD(b + u * g->ldb + j, m));",
        "bv[u] = SV_LD(b + u * g->ldb + j, m);", f"{TB}::test_bf16_products_round_ties_to_even_in_both_operands"),
    # k blocks on the AVX2 and generic paths (AVX2's are 384 deep: the tests' K of 400 crosses both depths)
    ("native/mgk_gemm_generic.inc", "float beta = pc == 0 ? g->beta : 1.0f;", "float beta = g->beta;",
        ISA),
    # the AVX2 packs of op(A) = A (6 rows by 8 k in registers) and op(B) = B^T, and the transposes they share with AVX-512's
    ("native/mgk_avx2.inc", "_mm_storel_pi((__m64 *)(ap + 6 * (c + 4) + 4), _mm256_extractf128_ps(r[4 + c], 1));",
        "_mm_storel_pi((__m64 *)(ap + 6 * (c + 4) + 4), _mm256_extractf128_ps(r[c], 1));",
        ISA),
    ("native/mgk_gemm_generic.inc", "GV_PACK_A8(A + (long)i0 * g->lda + k0 + k, g->lda",
        "GV_PACK_A8(A + (long)i0 * g->lda + k0, g->lda", ISA),
    ("native/mgk_gemm_generic.inc", "memcpy(dst + k * w, src, sizeof(float) * w);",
        "memcpy(dst + k * w, src + 1, sizeof(float) * w);", ISA),
    ("native/mgk_gemm_generic.inc", "GV(copy_rows)(bp, GV_NR, B + (long)k0 * g->ldb + j0 + jp, g->ldb, nr, kc);",
        "GV(copy_rows)(bp, GV_NR, B + (long)k0 * g->ldb + j0 + jp, g->ldb, nr - 1, kc);",
        ISA),
    ("native/mgk_gemm_generic.inc", "GV_PACK_BT8(b + k, g->ldb, bp + k * GV_NR + j, GV_NR);",
        "GV_PACK_BT8(b + k, g->ldb, bp + k * GV_NR, GV_NR);", ISA),
    ("native/mgk.c", "r[i + 2 * h + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(x, y));",
        "r[i + 2 * h + 1] = _mm256_castpd_ps(_mm256_unpacklo_pd(x, y));", EMU),
    # causal products: the k ranges and tiles a causal bmm skips (the C code), and the specification's zeroing
    ("native/mgk.c", "long long hi = (long long)i0 + mr + g->start - pc;",
     "long long hi = (long long)i0 + mr - 1 + g->start - pc;", CAUSAL),
    ("native/mgk.c", "long long lo = (long long)i0 - g->start - pc;",
     "long long lo = (long long)i0 + 1 - g->start - pc;", CAUSAL),
    ("native/mgk.c", "j0 > (long long)i0 + mr - 1 + g->start;", "j0 >= (long long)i0 + mr - 1 + g->start;", CAUSAL),
    ("native/mgk.c", "*k0 = lo <= 0 ? 0 : lo < kc ? (int)lo & ~1 : kc;",
     "*k0 = lo <= 0 ? 0 : lo < kc ? (int)lo : kc;", EMU),
    (BK, "np.copyto(out, 0, where=future(M, N, start))", "pass", CAUSAL),
    # Muon's momentum warm-up and the embeddings' lr (issue 24)
    (OPT, "return (1.0 - frac) * 0.85 + frac * self.momentum", "return self.momentum",
        f"{TMU}::test_muon_momentum_warmup_matches_float64_reference"),
    (OPT, "self.decay = {k for k in self.adamw_names if params[k].ndim >= 2}", "self.decay = set(self.adamw_names)",
        f"{TT}::test_weight_decay_only_on_matrices_and_embeddings"),
    (OPT, "self.adamw_state(params, set(params) - self.muon,", "self.adamw_state(params, set(params),",
        f"{TMU}::test_muon_step_matches_float64_reference_and_adamw"),
    (OPT, "lr_k = lr * self.lr_ratio_of.get(k, 1.0)", "lr_k = lr",
        f"{TMU}::test_embed_lr_ratio_scales_only_the_embeddings_adamw_lr"),
    (TRAIN, 'saved = {**ModelShape().model_dict(), **ckpt[0]["model_config"]}', 'saved = ckpt[0]["model_config"]',
        f"{TT}::test_checkpoints_from_before_the_speedrun_options_still_resume"),
    # the trapezoid lr (--cooldown): its line down, and the loop passing it on
    (OPT, "return lr if it < start else lr + (min_lr - lr) * (it - start) / (lr_decay_iters - start)",
        "return lr if it < start else lr + (min_lr - lr) * (it - start) / lr_decay_iters",
        f"{TT}::test_lr_schedule_trapezoid"),
    (TRAIN, "cfg.lr_decay_iters, cfg.cooldown)", "cfg.lr_decay_iters)",
        f"{TT}::test_max_time_ends_the_run_and_lays_the_schedule_over_the_budget"),
    # --context_warmup's short blocks, --batch_warmup's small batches and --dtype auto's choice
    (TRAIN, "T = cfg.block_size // 2 if done < cfg.context_warmup else cfg.block_size", "T = cfg.block_size",
        f"{TT}::test_the_warmups_halve_the_context_and_the_batch_for_their_share_of_the_run"),
    (TRAIN, 'x, y = run.data.batch("train", B, T,', 'x, y = run.data.batch("train", cfg.batch_size, T,',
        f"{TT}::test_the_warmups_halve_the_context_and_the_batch_for_their_share_of_the_run"),
    (TRAIN, "best = min(ms, key=ms.get)", "best = max(ms, key=ms.get)",
        f"{TT}::test_dtype_auto_takes_the_precision_whose_pass_is_faster"),
    (TRAIN, 'cfg.dtype = trained["dtype"]', 'pass', f"{TT}::test_a_resumed_auto_run_keeps_the_precision_it_chose"),
    (SPEC, "np.multiply(m, lr / bc1, out=step)", "np.multiply(g, lr, out=step)",
        f"{TT}::test_adamw_matches_the_textbook_over_steps_with_changing_gradients"),
    # the loop's wiring of one step (a hand replay of train()): accumulation, clipping, the lr, the optimizer's
    # settings
    (TRAIN, "for _ in range(cfg.grad_accum):", "for _ in range(1):", f"{TT}::test_train_steps_equal_a_hand_replay"),
    (TRAIN, "loss += model.forward(x, y)[1] / k", "loss = model.forward(x, y)[1] / k",
        f"{TT}::test_train_steps_equal_a_hand_replay"),
    (TRAIN, "clip_grad_norm(model.grad_memory, cfg.grad_clip)", "clip_grad_norm(model.grad_memory, 0.0)",
        f"{TT}::test_train_steps_equal_a_hand_replay"),
    (TRAIN, "run.opt.step(model.params(), model.grads(), lr)", "run.opt.step(model.params(), model.grads(), cfg.lr)",
        f"{TT}::test_train_steps_equal_a_hand_replay"),
    (TRAIN, "betas, params = (cfg.beta1, cfg.beta2), model.params()",
        "betas, params = (cfg.beta2, cfg.beta1), model.params()", f"{TT}::test_train_steps_equal_a_hand_replay"),
    (TRAIN, 'return opt.scale_lr(("wte.weight", "wpe.weight"), cfg.embed_lr_ratio)', "return opt",
        f"{TT}::test_train_steps_equal_a_hand_replay"),
    (TRAIN, "opt = AdamW(params, betas, weight_decay=cfg.weight_decay,", "opt = AdamW(params, betas,",
        f"{TT}::test_train_steps_equal_a_hand_replay"),
    (TRAIN, "opt = Muon(params, lr_ratio=cfg.muon_lr_ratio,", "opt = Muon(params,",
        f"{TT}::test_train_steps_equal_a_hand_replay"),
    # data parallel (needs mpi4py): each rank's share of the loss, and its slice of the global batch
    (TRAIN, "model.backward(scale=1.0 / k)", "model.backward(scale=1.0 / cfg.grad_accum)",
        f"{TD}::test_two_ranks_take_the_steps_of_one_process_with_twice_the_batch"),
    (DATA, "ix = ix[rank * batch_size:(rank + 1) * batch_size]", "ix = ix[:batch_size]",
        f"{TD}::test_two_ranks_take_the_steps_of_one_process_with_twice_the_batch"),
]


def build(tmp, env):
    """Rebuild the copy's native library in place (minigpt/_mgk*.so of the copy, which its tests load)."""
    r = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "--force"], cwd=tmp,
                       capture_output=True, text=True, env=env)
    if r.returncode:
        sys.exit(f"mutation_check: the native library of the copy does not build:\n{r.stderr[-2000:]}")


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    missed = 0
    with tempfile.TemporaryDirectory(prefix="minigpt-mutants-") as tmp:
        tmp = pathlib.Path(tmp)
        for d in ("minigpt", "tests", "scripts", "native"):      # copy2 keeps mtimes, so numba's cache stays valid
            shutil.copytree(root / d, tmp / d, ignore=shutil.ignore_patterns("*.pyc", "build"))
        for f in ("setup.cfg", "setup.py", "pyproject.toml"):
            shutil.copy2(root / f, tmp / f)
        env = {**os.environ, "PYTHONPATH": str(tmp)}   # the copy, ahead of the editable install
        for path, old, new, test in M:
            if sys.argv[1:] and not any(w in test or w in path for w in sys.argv[1:]):
                continue
            p = tmp / path
            src = p.read_text()
            assert src.count(old) == 1, f"{path}: {old!r} occurs {src.count(old)} times; update this mutation"
            stat = p.stat()
            p.write_text(src.replace(old, new))
            try:
                if path.startswith("native/"):             # C: the copy's library is rebuilt with the mutant
                    build(tmp, env)
                r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", test],
                                   cwd=tmp, capture_output=True, text=True, env=env)
            finally:
                p.write_text(src)
                os.utime(p, ns=(stat.st_atime_ns, stat.st_mtime_ns))
                if path.startswith("native/"):
                    build(tmp, env)
            why = [ln for ln in r.stdout.splitlines() if ln.startswith("E ")][:1]
            caught = r.returncode == 1 and "failed" in r.stdout.splitlines()[-1]
            missed += not caught
            label = "CAUGHT" if caught else f"MISSED (pytest exit {r.returncode})"
            print(f"{label:8} {test.split('/')[-1]:58} | {path.split('/')[-1]}: {new.strip()[:50]!r} | "
                  f"{why[0][2:].strip()[:90] if why else ''}", flush=True)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
