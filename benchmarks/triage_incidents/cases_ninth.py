"""The ninth set (issue 47): fixes from vLLM and SGLang not held before, each reversed onto the file of a released
wheel that has the fix. Written and committed before triage ran on them; first measured with the analysis as it
stood then (their figures are the held-out first measurement of this set).

Where the pull request's diff could not be read in full, the reversal is reconstructed from its description and
the released file, and the source says so ("pre-fix form reconstructed")."""

from __future__ import annotations

from .case import S410, S523, V10, V33, Case

NINTH = "ninth set"
V102 = ("vllm", "0.10.2")
S52 = ("sglang", "0.5.2")
S4996 = ("sglang", "0.4.9.post6")

_GLM = "vllm/model_executor/models/glm4_moe.py"
_DOTS = "vllm/model_executor/models/dots1.py"
_FIX_1 = (
    "            # we do scaling outside, set factor to 1.0 to avoid double mul\n"
    "            routed_scaling_factor=1.0,\n"
)
_BUG_1 = "            routed_scaling_factor=self.routed_scaling_factor,\n"

CASES: list[Case] = [
    Case(
        "vllm-43769",
        "vllm-project/vllm#43769 (FlashInfer TRTLLM BF16 MoE: routed_scaling_factor not passed to the kernel; "
        "GSM8K 0.378 vs 0.886); vllm 0.33.0, layers/fused_moe/experts/trtllm_bf16_moe.py",
        *V33,
        {
            "vllm/model_executor/layers/fused_moe/experts/trtllm_bf16_moe.py": [
                (
                    "            routed_scaling_factor=routed_scaling_factor,\n"
                    "            routing_method_type=self.routing_method_type,\n",
                    "            routing_method_type=self.routing_method_type,\n",
                )
            ]
        },
        "the factor's keyword dropped from the fused kernel call (the kernel applies none)",
        "routed_scaling_factor",
        (("vllm/model_executor/layers/fused_moe/experts/trtllm_bf16_moe.py", "routed_scaling_factor=routed_scaling"),),
        held_out=NINTH,
    ),
    Case(
        "vllm-24132-glm4",
        "vllm-project/vllm#24132 (GLM-4.5 MoE: routed_scaling_factor multiplied in FusedMoE and again in the model; "
        "pre-fix form reconstructed from the PR and #23123); vllm 0.10.2, models/glm4_moe.py",
        *V102,
        {_GLM: [(_FIX_1, _BUG_1)]},
        "the factor passed to FusedMoE where the model still multiplies its output by it",
        "routed_scaling_factor",
        (
            (_GLM, "routed_scaling_factor=self.routed_scaling_factor,"),
            (_GLM, "router_logits=router_logits) * self.routed_scaling_factor"),
        ),
        held_out=NINTH,
    ),
    Case(
        "vllm-24132-dots1",
        "vllm-project/vllm#24132 (dots1: routed_scaling_factor double multiply, GSM8K 0.014 -> 0.840; pre-fix form "
        "reconstructed from the PR and #23123); vllm 0.10.2, models/dots1.py",
        *V102,
        {_DOTS: [(_FIX_1, _BUG_1)]},
        "the factor passed to FusedMoE where the model still multiplies its output by it",
        "routed_scaling_factor",
        (
            (_DOTS, "routed_scaling_factor=self.routed_scaling_factor,"),
            (_DOTS, "router_logits=router_logits) * self.routed_scaling_factor"),
        ),
        held_out=NINTH,
    ),
    Case(
        "vllm-19592",
        "vllm-project/vllm#19592 (MiniMax-Text-01: LM head in bf16 gave low AIME scores and repeated output; fixed by "
        "an fp32 head; the KV-cache half of the PR left out); vllm 0.10.1.1, models/minimax_text_01.py",
        *V10,
        {
            "vllm/model_executor/models/minimax_text_01.py": [
                (
                    "            self.lm_head = PPMissingLayer()\n        self.lm_head.float()\n",
                    "            self.lm_head = PPMissingLayer()\n",
                ),
                (
                    "        logits = self.logits_processor(self.lm_head, hidden_states.float(),\n",
                    "        logits = self.logits_processor(self.lm_head, hidden_states,\n",
                ),
            ]
        },
        "an upcast removed: the LM head and its input no longer made float32",
        held_out=NINTH,
    ),
    Case(
        "sglang-6274",
        "sgl-project/sglang#6274 (Llama 4 on MI300X with SGLANG_AITER_MOE=1: router weight must be applied on the "
        "input, not by the kernel on the output); sglang 0.4.10, layers/quantization/unquant.py",
        *S410,
        {
            "sglang/srt/layers/quantization/unquant.py": [
                (
                    "                topk_weights, topk_ids, _ = topk_output\n"
                    "                if apply_router_weight_on_input:\n"
                    "                    assert (\n"
                    "                        topk_weights.dim() == 2\n"
                    '                    ), "`topk_weights` should be in shape (num_tokens, topk)"\n'
                    "                    _, topk = topk_weights.shape\n"
                    "                    assert (\n"
                    "                        topk == 1\n"
                    '                    ), "Only support topk=1 when `apply_router_weight_on_input` is True"\n'
                    "                    x = x * topk_weights.to(x.dtype)\n"
                    "                    topk_weights = torch.ones_like(\n"
                    "                        topk_weights, dtype=torch.float32\n"
                    "                    )  # topk_weights must be FP32 (float32)\n"
                    "                return fused_moe(\n",
                    "                topk_weights, topk_ids, _ = topk_output\n                return fused_moe(\n",
                )
            ]
        },
        "router weights applied downstream by the kernel instead of on the input (Llama 4's order)",
        held_out=NINTH,
    ),
    Case(
        "sglang-31232",
        "sgl-project/sglang#31232 (Ministral3 accuracy: YaRN mscale ignored rope_scaling's mscale/mscale_all_dim); "
        "sglang 0.5.23, layers/rotary_embedding/yarn.py",
        *S523,
        {
            "sglang/srt/layers/rotary_embedding/yarn.py": [
                (
                    "        if mscale is not None and mscale_all_dim is not None:\n"
                    "            # Match Hugging Face's YaRN RoPE scaling (supports mscale/mscale_all_dim)\n"
                    "            self.mscale = float(\n"
                    "                yarn_get_mscale(self.scaling_factor, mscale)\n"
                    "                / yarn_get_mscale(self.scaling_factor, mscale_all_dim)\n"
                    "            )\n"
                    "        else:\n"
                    "            # Get n-d magnitude scaling corrected for interpolation\n"
                    "            self.mscale = float(yarn_get_mscale_simple(self.scaling_factor))\n",
                    "        # Get n-d magnitude scaling corrected for interpolation\n"
                    "        self.mscale = float(yarn_get_mscale_simple(self.scaling_factor))\n",
                )
            ]
        },
        "a scale's form changed: the YaRN magnitude scale no longer reads mscale/mscale_all_dim",
        held_out=NINTH,
    ),
    Case(
        "vllm-13232",
        "vllm-project/vllm#13232 (DeepSeek-V2 in fp16: intermediate values overflow; fixed by folding the routed "
        "scale into the residual on fp16); vllm 0.10.1.1, models/deepseek_v2.py",
        *V10,
        {
            "vllm/model_executor/models/deepseek_v2.py": [
                (
                    "        if hidden_states.dtype != torch.float16:\n"
                    "            final_hidden_states = self.experts(\n"
                    "                hidden_states=hidden_states,\n"
                    "                router_logits=router_logits) * self.routed_scaling_factor\n"
                    "        else:\n"
                    "            # Fix FP16 overflow\n"
                    "            # See DeepseekV2DecoderLayer for more details.\n"
                    "            final_hidden_states = self.experts(hidden_states=hidden_states,\n"
                    "                                               router_logits=router_logits)\n"
                    "        if shared_output is not None:\n"
                    "            if hidden_states.dtype != torch.float16:\n"
                    "                final_hidden_states = final_hidden_states + shared_output\n"
                    "            else:\n"
                    "                # Fix FP16 overflow\n"
                    "                # See DeepseekV2DecoderLayer for more details.\n"
                    "                final_hidden_states = final_hidden_states + shared_output \\\n"
                    "                    * (1. / self.routed_scaling_factor)\n",
                    "        final_hidden_states = self.experts(\n"
                    "            hidden_states=hidden_states,\n"
                    "            router_logits=router_logits) * self.routed_scaling_factor\n"
                    "        if shared_output is not None:\n"
                    "            final_hidden_states = final_hidden_states + shared_output\n",
                ),
            ]
        },
        "an fp16 overflow guard removed (the routed output multiplied by the factor in fp16)",
        held_out=NINTH,
    ),
    Case(
        "vllm-16311",
        "vllm-project/vllm#16311 (Llama 4: QK norm must be per head, not across heads; MMLU-Pro 0.686 -> 0.715, TP=4 "
        "accuracy; pre-fix form reconstructed from the PR's description); vllm 0.10.1.1, models/llama4.py",
        *V10,
        {
            "vllm/model_executor/models/llama4.py": [
                (
                    "            q = q.reshape(-1, self.head_dim)\n"
                    "            q = self.qk_norm(q.float()).reshape(-1, self.q_size).to(q.dtype)\n"
                    "            k = k.reshape(-1, self.head_dim)\n"
                    "            k = self.qk_norm(k.float()).reshape(-1, self.kv_size).to(k.dtype)\n",
                    "            q = self.qk_norm(q.float()).to(q.dtype)\n"
                    "            k = self.qk_norm(k.float()).to(k.dtype)\n",
                )
            ]
        },
        "a normalization's form changed: QK norm over all heads instead of per head",
        held_out=NINTH,
    ),
    Case(
        "vllm-34353",
        "vllm-project/vllm#34353 (DeepSeek-V3.2 indexer RoPE: neox style must be the default when the config has no "
        "indexer_rope_interleave; an unintended default change in #34124; pre-fix default reconstructed from the PR); "
        "vllm 0.33.0, models/deepseek_v2.py",
        *V33,
        {
            "vllm/model_executor/models/deepseek_v2.py": [
                (
                    'is_neox_style=not getattr(config, "indexer_rope_interleave", False),',
                    'is_neox_style=not getattr(config, "indexer_rope_interleave", True),',
                )
            ]
        },
        "a flag's default changed: a config key's fallback flips the indexer's RoPE style",
        held_out=NINTH,
    ),
    Case(
        "vllm-53877",
        "vllm-project/vllm#53877 (packed GDN decode: beta rounded to the input dtype before the FP32 state update; "
        "long-context drift on Qwen3.5+); vllm 0.33.0, third_party/flash_linear_attention/ops/fused_recurrent.py",
        *V33,
        {
            "vllm/third_party/flash_linear_attention/ops/fused_recurrent.py": [
                (
                    "    beta_val = tl.sigmoid(b_val)\n",
                    "    beta_val = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)\n",
                )
            ]
        },
        "a precision change that is no dtype keyword: a round trip through the input dtype inside a Triton kernel",
        held_out=NINTH,
    ),
    Case(
        "vllm-34813",
        "vllm-project/vllm#34813 (GraniteMoeHybrid: embedding_multiplier not applied to inputs_embeds, garbage output "
        "with prompt embeds); vllm 0.33.0, models/granitemoehybrid.py",
        *V33,
        {
            "vllm/model_executor/models/granitemoehybrid.py": [
                (
                    "                hidden_states = self.embed_input_ids(input_ids)\n"
                    "            hidden_states *= self.embedding_multiplier\n",
                    "                hidden_states = self.embed_input_ids(input_ids)\n"
                    "                hidden_states *= self.embedding_multiplier\n",
                )
            ]
        },
        "a scale applied on one branch only (the embeddings path skips the multiplier)",
        held_out=NINTH,
    ),
    Case(
        "sglang-11791",
        "sgl-project/sglang#11791 (Qwen3-Omni vision merger: RMSNorm where the reference uses LayerNorm; MMMU subjects "
        "up to +16 points; pre-fix form reconstructed from the PR's title); sglang 0.5.23, models/qwen3_omni_moe.py",
        *S523,
        {
            "sglang/srt/models/qwen3_omni_moe.py": [
                (
                    "from sglang.srt.layers.attention.vision import VisionAttention\n",
                    "from sglang.srt.layers.attention.vision import VisionAttention\n"
                    "from sglang.srt.layers.layernorm import RMSNorm\n",
                ),
                ("        self.ln_q = nn.LayerNorm(\n", "        self.ln_q = RMSNorm(\n"),
            ]
        },
        "a normalization's form changed: LayerNorm replaced by RMSNorm (no mean subtracted)",
        held_out=NINTH,
    ),
    Case(
        "sglang-33764",
        "sgl-project/sglang#33764 (Kimi-K3: the fused front GEMM wrote router logits in bf16; 5.27 % of tokens got a "
        "different top-16 expert set; pre-fix form reconstructed from the PR); sglang 0.5.23, models/kimi_k3.py",
        *S523,
        {
            "sglang/srt/models/kimi_k3.py": [
                (
                    "        fused = _k3_bf16_gemm(\n"
                    "            hidden_states,\n"
                    "            self._front_w,\n"
                    "            out_dtype=torch.float32 if self._front_fp32 else None,\n"
                    "        )\n",
                    "        fused = _k3_bf16_gemm(hidden_states, self._front_w)\n",
                )
            ]
        },
        "a precision change that is no dtype keyword on a module: a GEMM's output dtype argument dropped",
        held_out=NINTH,
    ),
    Case(
        "vllm-16801",
        "vllm-project/vllm#16801 (Llama 4 int4 accuracy: router scores must be returned as float for the MoE kernels; "
        "pre-fix form reconstructed from the PR's point 3); vllm 0.10.1.1, models/llama4.py",
        *V10,
        {
            "vllm/model_executor/models/llama4.py": [
                (
                    "        # pseudo-standard is that the router scores are floats\n"
                    "        router_scores = torch.sigmoid(router_scores.float())\n",
                    "        router_scores = torch.sigmoid(router_scores.float()).to(\n"
                    "            hidden_states.dtype)\n",
                )
            ]
        },
        "router weights downcast to the activation dtype before the kernel applies them",
        held_out=NINTH,
    ),
    Case(
        "vllm-12002",
        "vllm-project/vllm#12002 (DeepSeek-V3 gate: the correction bias is for selection only, routing weights come "
        "from the unbiased scores); vllm 0.10.1.1, layers/fused_moe/fused_moe.py",
        *V10,
        {
            "vllm/model_executor/layers/fused_moe/fused_moe.py": [
                (
                    "        # Store original scores before applying correction bias. We use biased\n"
                    "        # scores for expert selection but original scores for routing weights\n"
                    "        original_scores = scores\n",
                    "",
                ),
                (
                    "    if e_score_correction_bias is not None:\n"
                    "        topk_ids = torch.topk(tmp_scores, k=topk, dim=-1, sorted=False)[1]\n"
                    "        # Use original unbiased scores for the routing weights\n"
                    "        topk_weights = original_scores.gather(1, topk_ids)\n"
                    "    else:\n"
                    "        topk_weights, topk_ids = torch.topk(tmp_scores,\n"
                    "                                            k=topk,\n"
                    "                                            dim=-1,\n"
                    "                                            sorted=False)\n",
                    "    topk_weights, topk_ids = torch.topk(tmp_scores,\n"
                    "                                        k=topk,\n"
                    "                                        dim=-1,\n"
                    "                                        sorted=False)\n",
                ),
            ]
        },
        "routing weights taken from the bias-corrected scores (the weights' form changed)",
        held_out=NINTH,
    ),
    Case(
        "vllm-13474",
        "vllm-project/vllm#13474 (DeepSeek-V3 grouped top-k: group score is the sum of the top-2, masked experts -inf "
        "not 0); vllm 0.10.1.1, layers/fused_moe/fused_moe.py",
        *V10,
        {
            "vllm/model_executor/layers/fused_moe/fused_moe.py": [
                (
                    "        group_scores = (scores.view(num_token, num_expert_group,\n"
                    "                                    -1).topk(2, dim=-1)[0].sum(dim=-1))\n"
                    "    else:\n"
                    "        group_scores = scores.view(num_token, num_expert_group,\n"
                    "                                   -1).max(dim=-1).values  # [n, n_group]\n",
                    "    group_scores = scores.view(num_token, num_expert_group,\n"
                    "                               -1).max(dim=-1).values  # [n, n_group]\n",
                ),
                (
                    "    tmp_scores = scores.masked_fill(~score_mask.bool(),\n"
                    '                                    float("-inf"))  # [n, e]\n',
                    "    tmp_scores = scores.masked_fill(~score_mask.bool(), 0.0)  # [n, e]\n",
                ),
            ]
        },
        "a selection's form changed: group score by max, masked experts scored 0 (selectable when scores are negative)",
        held_out=NINTH,
    ),
    Case(
        "vllm-11921",
        "vllm-project/vllm#11921 (fused_experts_impl: float32 inputs computed as float16 in the Triton MoE kernel, "
        "overflow; pre-fix form reconstructed from the PR's title); vllm 0.10.1.1, layers/fused_moe/fused_moe.py",
        *V10,
        {
            "vllm/model_executor/layers/fused_moe/fused_moe.py": [
                (
                    "\n    if hidden_states.dtype == torch.bfloat16:\n"
                    "        compute_type = tl.bfloat16\n"
                    "    elif hidden_states.dtype == torch.float16:\n"
                    "        compute_type = tl.float16\n"
                    "    elif hidden_states.dtype == torch.float32:\n"
                    "        compute_type = tl.float32\n"
                    "    else:\n"
                    '        raise ValueError(f"Unsupported compute_type: {hidden_states.dtype}")\n',
                    "\n    compute_type = (tl.bfloat16\n"
                    "                    if hidden_states.dtype == torch.bfloat16 else tl.float16)\n",
                )
            ]
        },
        "a precision change that is no dtype keyword: a Triton compute type chosen by a conditional",
        held_out=NINTH,
    ),
    Case(
        "sglang-12186",
        "sgl-project/sglang#12186 (MiniMax-M2 RMSNorm precision: scale by the weight in fp32 before the cast; pre-fix "
        "form reconstructed from the PR's description); sglang 0.5.23, models/minimax_m2.py",
        *S523,
        {
            "sglang/srt/models/minimax_m2.py": [
                ("        x = (x * self.weight).to(orig_dtype)\n", "        x = x.to(orig_dtype) * self.weight\n")
            ]
        },
        "a normalization's form changed: the weight multiply moved after the downcast",
        held_out=NINTH,
    ),
    Case(
        "sglang-13495",
        "sgl-project/sglang#13495 (DeepSeek-V3.2 NSA indexer: RoPE must be neox style, RULER niah_multikey_3 16k "
        "87.5 -> 100; pre-fix form reconstructed: the indexer's style hard-coded); sglang 0.5.23, "
        "models/deepseek_v2.py",
        *S523,
        {
            "sglang/srt/models/deepseek_v2.py": [
                (
                    '                is_neox_style = not getattr(config, "indexer_rope_interleave", False)\n',
                    "                is_neox_style = False\n",
                )
            ]
        },
        "a config-driven flag replaced by a constant (the indexer's RoPE interleaved)",
        held_out=NINTH,
    ),
    Case(
        "sglang-9884",
        "sgl-project/sglang#9884 (GLM-4.5V vision block norm: MMMU 0.264 before the fix; the reversal is the hunk "
        "between the 0.5.1 and 0.5.2 wheels); sglang 0.5.2, models/glm4v.py",
        *S52,
        {
            "sglang/srt/models/glm4v.py": [
                (
                    "            num_dummy_heads=config.num_dummy_heads,\n"
                    "            rms_norm_eps=config.rms_norm_eps,\n"
                    "        )\n",
                    "            num_dummy_heads=config.num_dummy_heads,\n"
                    "        )\n"
                    "        self.norm1 = Glm4vRMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n"
                    "        self.norm2 = Glm4vRMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n",
                )
            ]
        },
        "a normalization replaced after construction (the block's norms swapped for another class)",
        held_out=NINTH,
    ),
]
