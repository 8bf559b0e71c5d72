"""Incidents from SGLang (wheels of sglang 0.4.10, 0.5.1 and 0.5.23): each a public fix reversed onto the
release's file."""

from __future__ import annotations

from .case import S51, S410, S523, Case

CASES: list[Case] = [
    Case(
        "sglang-2048",
        "sgl-project/sglang#2048 (MI300X with overlap: out_cache_loc must be torch.zeros, not torch.empty)",
        *S410,
        {
            "sglang/srt/model_executor/cuda_graph_runner.py": [
                (
                    "            self.out_cache_loc = torch.zeros((self.max_num_token,), dtype=torch.int64)\n",
                    "            self.out_cache_loc = torch.empty((self.max_num_token,), dtype=torch.int64)\n",
                )
            ]
        },
        "a CUDA-graph input buffer allocated uninitialised",
    ),
    Case(
        "sglang-2048-0.5.23",
        "sgl-project/sglang#2048 again, on the refactored 0.5.23 buffers (runner_utils/buffers.py)",
        *S523,
        {
            "sglang/srt/model_executor/runner_utils/buffers.py": [
                (
                    "            out_cache_loc = torch.zeros((max_num_token,), dtype=cache_loc_dtype)\n",
                    "            out_cache_loc = torch.empty((max_num_token,), dtype=cache_loc_dtype)\n",
                )
            ]
        },
        "a CUDA-graph input buffer allocated uninitialised (later release)",
    ),
    Case(
        "sglang-7233",
        "sgl-project/sglang#7233 (use seq_len_fill_value in the cuda graph runners)",
        *S410,
        {
            "sglang/srt/model_executor/cuda_graph_runner.py": [
                ("            self.seq_lens.fill_(self.seq_len_fill_value)\n", "            self.seq_lens.fill_(1)\n")
            ]
        },
        "the padded seq_lens of a replayed CUDA graph filled with a constant",
    ),
    Case(
        "sglang-8333",
        "sgl-project/sglang#8333 (FP4 MoE accuracy: routed_scaling_factor missing in the cutlass path)",
        *S410,
        {
            "sglang/srt/layers/quantization/modelopt_quant.py": [
                (
                    "        ).to(x.dtype)\n        if routed_scaling_factor is not None:\n"
                    "            output *= routed_scaling_factor\n"
                    "        return output\n",
                    "        ).to(x.dtype)\n        return output\n",
                )
            ]
        },
        "the factor's multiply removed from quant_method.apply",
        "routed_scaling_factor",
        (("sglang/srt/layers/quantization/modelopt_quant.py", "output *= routed_scaling_factor"),),
    ),
    Case(
        "sglang-8770",
        "sgl-project/sglang#8770 / #8364 (cutlass FP8 MoE at 0.832 accuracy: routed_scaling_factor not applied "
        "once the model stopped multiplying)",
        *S51,
        {
            "sglang/srt/layers/moe/topk.py": [
                (
                    "ALL:        topk_weights = topk_weights / topk_weights_sum\n"
                    "        if apply_routed_scaling_factor_on_output:\n"
                    "            topk_weights *= routed_scaling_factor\n\n    topk_weights, topk_ids = ",
                    "        topk_weights = topk_weights / topk_weights_sum\n\n    topk_weights, topk_ids = ",
                )
            ]
        },
        "the fused top-k's multiply by the factor removed while the model relies on it",
        "routed_scaling_factor",
        (("sglang/srt/layers/moe/topk.py", "topk_weights *= routed_scaling_factor"),),
    ),
    Case(
        "sglang-31762",
        "sgl-project/sglang#31762 (Marlin NVFP4: routed_scaling_factor applied in top-k and again in "
        "moe_sum_reduce: garbage text)",
        *S523,
        {
            "sglang/srt/layers/moe/fused_moe_triton/layer.py": [
                (
                    "            isinstance(quant_method, ModelOptNvFp4FusedMoEMethod)\n"
                    "            # Marlin, or the LoRA MoE runner on its Marlin NVFP4 vendor.\n"
                    "            and (\n                runner_backend is None\n"
                    "                or not (runner_backend.is_marlin() or runner_backend.is_lora_marlin())\n"
                    "            )\n        )\n",
                    "            isinstance(quant_method, ModelOptNvFp4FusedMoEMethod)\n        )\n",
                )
            ]
        },
        "the Marlin exclusion dropped from the fuse-the-factor-in-top-k condition",
        "routed_scaling_factor",
        (("sglang/srt/layers/moe/fused_moe_triton/fused_marlin_moe.py", "            routed_scaling_factor,"),),
    ),
    Case(
        "sglang-35152",
        "sgl-project/sglang#35152 (two-batch-overlap op_output multiplied by routed_scaling_factor "
        "unconditionally, also where top-k had folded it in: output x rsf^2)",
        *S523,
        {
            "sglang/srt/models/deepseek_v2.py": [
                (
                    "        state.hidden_states_mlp_output = _scale_routed_and_add_shared(\n"
                    "            final_hidden_states,\n"
                    '            state.pop("shared_output"),\n'
                    "            routed_scaling_factor=self.routed_scaling_factor,\n"
                    "            fused_in_topk=self.routed_scaling_factor_fused_in_topk,\n"
                    "        )\n",
                    '        if (shared_output := state.pop("shared_output")) is not None:\n'
                    "            x = shared_output\n"
                    "            x.add_(final_hidden_states, alpha=self.routed_scaling_factor)\n"
                    "            final_hidden_states = x\n"
                    "        else:\n"
                    "            final_hidden_states *= self.routed_scaling_factor\n\n"
                    "        state.hidden_states_mlp_output = final_hidden_states\n",
                )
            ]
        },
        "the guarded scale-and-add of the TBO epilogue replaced by an unconditional multiply",
        "routed_scaling_factor",
        (("sglang/srt/models/deepseek_v2.py", "x.add_(final_hidden_states, alpha=self.routed_scaling_factor)"),),
    ),
    Case(
        "sglang-38963",
        "sgl-project/sglang#38963 (DeepSeek-V4.1 VL routing: num_fused_shared_experts not forwarded to "
        "moe_fused_gate, a routed expert replaced the fused shared expert: garbage logits)",
        *S523,
        {
            "sglang/srt/multimodal/dsv41/vl_routing.py": [
                ("            num_fused_shared_experts=num_shared_topk_slots,\n", "")
            ]
        },
        "an argument dropped from the fused top-k call (the shared-expert slots)",
    ),
    Case(
        "sglang-18396",
        "sgl-project/sglang#18396 (TRT-LLM MLA: checkpoint k_scale applied in BMM1 although the KV cache is "
        "BF16: scores ~16x too small, degenerate output)",
        *S523,
        {
            "sglang/srt/layers/attention/trtllm_mla_backend.py": [
                (
                    "        q_scale = 1.0\n        if self.data_type == torch.float8_e4m3fn:\n"
                    "            k_scale = (\n                layer.k_scale_float\n"
                    '                if getattr(layer, "k_scale_float", None) is not None\n'
                    "                else 1.0\n            )\n        else:\n"
                    '            if getattr(layer, "k_scale_float", None) is not None:\n'
                    "                logger.warning_once(\n"
                    '                    "Checkpoint has k_scale but KV cache dtype is not FP8. "\n'
                    '                    "Ignoring k_scale for BMM1 (k_scale=%.4f, kv_dtype=%s).",\n'
                    "                    layer.k_scale_float,\n                    self.data_type,\n"
                    "                )\n            k_scale = 1.0\n",
                    "        q_scale = 1.0\n        k_scale = (\n            layer.k_scale_float\n"
                    '            if getattr(layer, "k_scale_float", None) is not None\n'
                    "            else 1.0\n        )\n",
                )
            ]
        },
        "the FP8-only gate on the checkpoint's k_scale removed from the decode BMM1 scale",
        "k_scale",
        (("sglang/srt/layers/attention/trtllm_mla_backend.py", "return q_scale * k_scale * layer.scaling"),),
    ),
    Case(
        "sglang-10400",
        "sgl-project/sglang#10400 (init the mamba memory pools with torch.zeros: uninitialised conv/SSM state "
        "read by the first step)",
        *S523,
        {
            "sglang/srt/mem_cache/memory_pool.py": [
                (
                    "                conv_state = [\n                    torch.zeros(\n"
                    "                        size=(num_mamba_layers, size + 1) + conv_shape,\n",
                    "                conv_state = [\n                    torch.empty(\n"
                    "                        size=(num_mamba_layers, size + 1) + conv_shape,\n",
                ),
                (
                    "                temporal_state = torch.zeros(\n"
                    "                    size=(num_mamba_layers, size + 1) + temporal_state_shape,\n",
                    "                temporal_state = torch.empty(\n"
                    "                    size=(num_mamba_layers, size + 1) + temporal_state_shape,\n",
                ),
            ]
        },
        "the mamba conv and temporal state pools allocated uninitialised (on the refactored 0.5.23 pool)",
    ),
    Case(
        "sglang-29278",
        "sgl-project/sglang#29278 / #28144 (TRTLLM MHA FP8 KV cache: bmm2_scale hard-coded to 1.0, the V descale "
        "never applied: low-quality, repetitive text on Llama-3.1-70B-Instruct-FP8)",
        *S523,
        {
            "sglang/srt/layers/attention/trtllm_mha_backend.py": [
                (
                    '        v_scale = self._get_scalar_scale(layer, "v_scale_float", "v_scale")\n'
                    "        return q_scale * k_scale * layer.scaling, v_scale\n",
                    "        return q_scale * k_scale * layer.scaling, 1.0\n",
                )
            ]
        },
        "the FP8 KV cache's V descale replaced by the identity 1.0 in the BMM2 scale returned to the kernel",
        "v_scale",
        (("sglang/srt/layers/attention/trtllm_mha_backend.py", "return q_scale * k_scale * layer.scaling, 1.0"),),
    ),
    Case(
        "sglang-1779",
        "sgl-project/sglang#1779 (NaNs with FlashInfer under CUDA graphs, #1571: padded requests had seq_len 0; "
        "the fix fills them with 1)",
        *S410,
        {
            "sglang/srt/layers/attention/flashinfer_backend.py": [
                (
                    "    def get_cuda_graph_seq_len_fill_value(self):\n        return 1\n",
                    "    def get_cuda_graph_seq_len_fill_value(self):\n        return 0\n",
                )
            ]
        },
        "the FlashInfer backend's padded seq_len for replayed CUDA graphs back to 0 (on the 0.4.10 backend method)",
    ),
    Case(
        "sglang-20819",
        "sgl-project/sglang#20819 (block-FP8 Triton GEMM: scale_step_k = BLOCK_SIZE_K // group_k is 0 when "
        "BLOCK_SIZE_K < group_k, so the K scales never advance; seen with tuned configs on Qwen3.5-35B-A3B-FP8)",
        *S523,
        {
            "sglang/kernels/ops/gemm/fp8_kernel.py": [
                (
                    "    n_tiles_k_per_group_k = group_k // BLOCK_SIZE_K\n\n"
                    "    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)\n"
                    "    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):\n        if needs_masking:\n",
                    "    scale_step_k = BLOCK_SIZE_K // group_k\n\n"
                    "    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)\n"
                    "    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):\n        if needs_masking:\n",
                ),
                (
                    "        scale_step_k = tl.where((k + 1) % n_tiles_k_per_group_k == 0, 1, 0)\n"
                    "        accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :]\n",
                    "        accumulator += tl.dot(a, b) * a_s[:, None] * b_s[None, :]\n",
                ),
            ]
        },
        "the K-scale pointer step of the shared block-FP8 Triton GEMM back to an integer division that is 0 for "
        "small K tiles (only `_w8a8_block_fp8_matmul`, the kernel the fix changed; the later Hopper split-K and "
        "gfx1250 kernels keep it)",
    ),
    Case(
        "sglang-33558",
        "sgl-project/sglang#33558 (Laguna: HF's attention_factor, the final YaRN mscale, copied straight into "
        "attn_factor, which SGLang's YaRN multiplies onto its own yarn_get_mscale_simple(factor): the scale squared, "
        "global-attention layers corrupted, GSM8K ~20 points low)",
        *S523,
        {
            "sglang/srt/configs/laguna.py": [
                (
                    '    if "attention_factor" in rope_params:\n'
                    "        # attention_factor is the final YaRN mscale; SGLang multiplies attn_factor\n"
                    "        # onto its own default, so divide that out to avoid squaring the scale.\n"
                    "        # Drop mscale/mscale_all_dim so the embedding uses that simple default as\n"
                    "        # its base (yarn.py picks the mscale/mscale_all_dim ratio when both are set).\n"
                    "        from sglang.srt.layers.rotary_embedding.yarn import yarn_get_mscale_simple\n\n"
                    '        out.pop("mscale", None)\n'
                    '        out.pop("mscale_all_dim", None)\n'
                    '        factor = float(rope_params.get("factor", 1.0) or 1.0)\n'
                    '        out["attn_factor"] = rope_params["attention_factor"] / yarn_get_mscale_simple(\n'
                    "            factor\n        )\n",
                    '    if "attention_factor" in rope_params:\n'
                    '        out["attn_factor"] = rope_params["attention_factor"]\n',
                )
            ]
        },
        "the YaRN attention_factor passed through as attn_factor again, so the rotary embedding applies it on top of "
        "its own mscale (the pre-fix form as the PR describes it, 'copying it straight in'; whether the pre-fix code "
        "also kept mscale/mscale_all_dim is not known here, they are kept)",
    ),
    Case(
        "sglang-26203",
        "sgl-project/sglang#26203 (MLA attention over-scaled when YaRN scaling is disabled: native Mistral configs map "
        "apply_scale=false to apply_yarn_scaling=False, and the MLA softmax scale still took mscale**2; B200 NVFP4 "
        "accuracy drop; 0.1950 instead of the base 0.0884)",
        *S523,
        {
            "sglang/srt/configs/model_config.py": [
                (
                    '    if not rope_scaling.get("apply_yarn_scaling", True) or not rope_scaling.get(\n'
                    '        "apply_scale", True\n    ):\n        return base_scaling\n\n',
                    "",
                )
            ]
        },
        "the early return that keeps the base MLA softmax scale when YaRN scaling is disabled removed from "
        "compute_mla_mscale_scaling (the fix added the apply_yarn_scaling arm; the apply_scale arm beside it in 0.5.23 "
        "may be later, and goes with it)",
    ),
    Case(
        "sglang-8685",
        "sgl-project/sglang#8685 (cutlass MLA at 0.000 GSM8K accuracy: #8632 added a parameter, NUM_PAGE_PER_BLOCK, "
        "before PAGED_SIZE in create_flashmla_kv_indices_triton, and the cutlass MLA backend passed the page size "
        "positionally, so it landed in the new parameter; the fix passes it by name)",
        *S51,
        {
            "sglang/srt/layers/attention/cutlass_mla_backend.py": [
                ("ALL:PAGED_SIZE=PAGE_SIZE,\n", "PAGE_SIZE,\n"),
            ]
        },
        "the page size passed positionally again at the three calls of the KV-index Triton kernel, where it binds to "
        "NUM_PAGE_PER_BLOCK and PAGED_SIZE keeps its default of 64 (the diff between the 0.4.10 and 0.5.1 wheels is "
        "exactly these three lines)",
    ),
    Case(
        "sglang-19247",
        "sgl-project/sglang#19247 ([AMD] accuracy with --enable-dp-attention: at tp8/dp8 the attention TP size is 1, "
        "each GPU sees all 128 heads, and the persistent a16w16 MLA decode kernel, which does not support 128 heads, "
        "was selected; the comment said so but the condition did not include it)",
        *S523,
        {
            "sglang/srt/layers/attention/aiter_backend.py": [
                (
                    "            if (\n"
                    '                (self.mla_kernel_num_head_padded == 16 and self.head_pad_mode != "zero")\n'
                    "                or self.mla_kernel_num_head_padded == 128\n"
                    "            ) and self.kv_cache_dtype is not fp8_dtype:\n",
                    "            if (\n"
                    '                self.mla_kernel_num_head_padded == 16 and self.head_pad_mode != "zero"\n'
                    "            ) and self.kv_cache_dtype is not fp8_dtype:\n",
                )
            ]
        },
        "the 128-head arm dropped from the condition that falls back from the persistent MLA decode kernel for a "
        "non-FP8 KV cache, so 128 heads select the persistent kernel again (the fix added `num_head == 128`; 0.5.23 "
        "reads the padded head count and has a zero-pad arm added since, both kept; the comments are left as they are)",
    ),
]
