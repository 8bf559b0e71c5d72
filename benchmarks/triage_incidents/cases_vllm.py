"""Incidents from vLLM (wheels of vllm 0.33.0 and 0.10.1.1): each a public fix reversed onto the release's file."""

from __future__ import annotations

from .case import DSV2, FMOE, FMOE_10, V10, V33, Case

CASES: list[Case] = [
    Case(
        "vllm-45037",
        "vllm-project/vllm#45037 (Nemotron accuracy: routed_scaling_factor applied twice, from #41184)",
        *V33,
        {
            FMOE: [
                (
                    "        routed_scaling_factor=routed_scaling_factor\n        if not apply_routed_scale_to_output\n"
                    "        else 1.0,\n        swiglu_limit",
                    "        routed_scaling_factor=routed_scaling_factor,\n        swiglu_limit",
                )
            ]
        },
        "the identity condition dropped from the RoutedExperts argument",
        "routed_scaling_factor",
        (
            (FMOE, "routed_scaling_factor=routed_scaling_factor,"),
            ("vllm/model_executor/layers/fused_moe/runner/moe_runner.py", "routed_scaling_factor"),
        ),
    ),
    Case(
        "vllm-38822",
        "vllm-project/vllm#49917 (head size 512 advertised arch-blind by #38822; crashes off SM100)",
        *V33,
        {"vllm/v1/attention/backends/flashinfer.py": [("return [64, 128, 256]\n", "return [64, 128, 256, 512]\n")]},
        "a kernel's supported head sizes widened",
        base={
            "vllm/v1/attention/backends/flashinfer.py": [("return [64, 128, 256, 512]\n", "return [64, 128, 256]\n")]
        },
    ),
    Case(
        "vllm-52050",
        "vllm-project/vllm#52050 (FA4 head-dim 256 must fall back to FA2: seqused_q/k unsupported)",
        *V33,
        {
            "vllm/v1/attention/backends/fa_utils.py": [
                (
                    "            if not supports_fa4_hd256:\n                fa_version = 2\n            elif (\n",
                    "            if (\n",
                )
            ]
        },
        "a kernel-selection fallback removed (FA4 hd256 selected where it is unsupported)",
    ),
    Case(
        "vllm-45720",
        "vllm-project/vllm#45720 (MiniMax-M3 FP8 KV cache read as float8_e4m3fn on FNUZ platforms)",
        *V33,
        {
            "vllm/models/minimax_m3/common/sparse_attention.py": [
                (
                    "            self.kv_cache_fp8_dtype = current_platform.fp8_dtype()\n",
                    "            self.kv_cache_fp8_dtype = torch.float8_e4m3fn\n",
                )
            ]
        },
        "a KV-cache dtype assignment hard-coded",
    ),
    Case(
        "vllm-25447",
        "vllm-project/vllm#25447 (CpuGpuBuffer: callers assume zeroed buffers; first revision used empty)",
        *V33,
        {
            "vllm/v1/utils.py": [
                ("            self.cpu = torch.zeros(\n", "            self.cpu = torch.empty(\n"),
                (
                    "            self.gpu = torch.zeros_like(self.cpu, device=device)\n",
                    "            self.gpu = torch.empty_like(self.cpu, device=device)\n",
                ),
            ]
        },
        "empty/empty_like replacing zeros/zeros_like for runtime buffers",
    ),
    Case(
        "vllm-19784",
        "vllm-project/vllm#19784 (zero-initialise the attention output buffer: NaNs in the profiling run)",
        *V10,
        {
            "vllm/attention/layer.py": [
                ("            output = torch.zeros(output_shape,\n", "            output = torch.empty(output_shape,\n")
            ]
        },
        "torch.empty replacing torch.zeros for a buffer the kernel accumulates into",
    ),
    Case(
        "vllm-14809",
        "vllm-project/vllm#14809 (DeepSeek fp16: `residual *= 1/routed_scaling_factor` ran on several layers)",
        *V10,
        {
            DSV2: [
                (
                    "            if self.layer_idx == 0:\n"
                    "                # The residual is shared by all layers, we only scale it on\n"
                    "                # first layer.\n                residual *= 1. / self.routed_scaling_factor\n",
                    "            residual *= 1. / self.routed_scaling_factor\n",
                )
            ]
        },
        "a per-layer residual rescale: the first-layer guard dropped",
        "routed_scaling_factor",
        ((DSV2, "residual *= 1. / self.routed_scaling_factor"),),
    ),
    Case(
        "vllm-23123",
        "vllm-project/vllm#24119 (R1 accuracy: routed_scaling_factor multiplied twice, introduced by #23123)",
        *V10,
        {
            "vllm/model_executor/layers/quantization/fp8.py": [
                (
                    "                    routed_scaling=1.0,\n",
                    "                    routed_scaling=layer.routed_scaling_factor,\n",
                )
            ],
            FMOE_10: [
                (
                    "        has_bias: bool = False,\n    ):\n        super().__init__()\n",
                    "        has_bias: bool = False,\n        routed_scaling_factor: float = 1.0,\n    ):\n"
                    "        super().__init__()\n        self.routed_scaling_factor = routed_scaling_factor\n",
                )
            ],
            DSV2: [
                (
                    "            e_score_correction_bias=self.gate.e_score_correction_bias,\n            enable_eplb",
                    "            e_score_correction_bias=self.gate.e_score_correction_bias,\n"
                    "            routed_scaling_factor=self.routed_scaling_factor,\n            enable_eplb",
                )
            ],
        },
        "the identity literal 1.0 passed to the fused kernel replaced by the factor, the model still multiplies",
        "routed_scaling_factor",
        (
            (DSV2, "router_logits=router_logits) * self.routed_scaling_factor"),
            ("vllm/model_executor/layers/quantization/fp8.py", "routed_scaling=layer.routed_scaling_factor"),
        ),
    ),
    Case(
        "vllm-52692",
        "vllm-project/vllm#52692 / #52667 (PaliGemma image embeddings still multiplied by hidden_size**-0.5 "
        "after Gemma's normalizer moved to the text embedding: images at 1/sqrt(H) of their magnitude)",
        *V33,
        {
            "vllm/model_executor/models/paligemma.py": [
                (
                    "        vision_embeddings = self._process_image_input(image_input)\n"
                    "        return vision_embeddings\n",
                    "        vision_embeddings = self._process_image_input(image_input)\n"
                    "        vision_embeddings = vision_embeddings * (self.config.hidden_size**-0.5)\n"
                    "        return vision_embeddings\n",
                )
            ]
        },
        "a stale inverse normalizer re-applied to the projected image features (a multiply by a power of a size)",
    ),
    Case(
        "vllm-31380",
        "vllm-project/vllm#31380 (chunked_prefill_paged_decode: default sm_scale from query.shape[1], the number "
        "of heads, instead of query.shape[2], the head size)",
        *V33,
        {
            "vllm/v1/attention/ops/chunked_prefill_paged_decode.py": [
                (
                    "        sm_scale = 1.0 / (query.shape[2] ** 0.5)\n",
                    "        sm_scale = 1.0 / (query.shape[1] ** 0.5)\n",
                )
            ]
        },
        "the default softmax scale computed from the wrong dimension",
    ),
    Case(
        "vllm-3653",
        "vllm-project/vllm#3653 (Gemma, #3411; after huggingface/transformers#29402: the sqrt(hidden_size) "
        "normalizer must be rounded to the model dtype: 55.5 in bf16 for hidden_size 3072, not 55.4256)",
        *V10,
        {
            "vllm/model_executor/models/gemma.py": [
                (
                    "            hidden_states *= self.normalizer\n",
                    "            # Normalize the embedding by sqrt(hidden_size)\n"
                    "            hidden_states *= self.config.hidden_size**0.5\n",
                ),
                (
                    "        # Normalize the embedding by sqrt(hidden_size)\n"
                    "        # The normalizer's data type should be downcasted to the model's\n"
                    "        # data type such as bfloat16, not float32.\n"
                    "        # See https://github.com/huggingface/transformers/pull/29402\n"
                    "        normalizer = self.config.hidden_size**0.5\n"
                    '        self.register_buffer("normalizer",\n'
                    "                             torch.tensor(normalizer),\n"
                    "                             persistent=False)\n",
                    "",
                ),
            ]
        },
        "the embedding normalizer applied as a Python float instead of a buffer cast to the model dtype (a precision "
        "change of a multiply by a root)",
    ),
    Case(
        "vllm-18807",
        "vllm-project/vllm#18807 (FA2 MLA accuracy, #18561 / #18766: the padded V output sliced inside the "
        "attention helper, before merge_attn_states, which does not support tensor slices; DeepSeek-V2-Lite gsm8k "
        "broken on A100)",
        *V10,
        {
            "vllm/v1/attention/backends/mla/common.py": [
                (
                    "            attn_out, lse = attn_out[0], attn_out[1]\n\n"
                    "        # Remain consistent with old `flash_attn_varlen_func` where there\n",
                    "            attn_out, lse = attn_out[0], attn_out[1]\n\n"
                    "        # unpad if necessary\n        if self._pad_v:\n"
                    "            attn_out = attn_out[..., :v.shape[-1]]\n\n"
                    "        # Remain consistent with old `flash_attn_varlen_func` where there\n",
                ),
                (
                    "        # unpad if necessary\n        if self._pad_v:\n"
                    "            output = output[..., :v.shape[-1]]\n\n"
                    "        return output.flatten(start_dim=-2)\n",
                    "        return output.flatten(start_dim=-2)\n",
                ),
            ]
        },
        "the unpadding of the MLA prefill output moved back before the attention-state merges (a slice handed to "
        "merge_attn_states)",
    ),
    Case(
        "vllm-16439",
        "vllm-project/vllm#16439 (Llama 4: attention temperature tuning on the NoPE layers enabled by default for "
        "long context, > 32k; without it RULER long-context accuracy drops; the pre-fix default `False` as in the "
        "context of #16216's diff)",
        *V10,
        {
            "vllm/model_executor/models/llama4.py": [
                (
                    "        # enable temperature tuning by default when max_model_len > 32K\n"
                    "        default_attn_temperature_tuning = \\\n"
                    "            vllm_config.model_config.max_model_len > 32768\n"
                    "        vllm_config.model_config.hf_config.attn_temperature_tuning \\\n"
                    "            = gen_config.get(\n"
                    '                "attn_temperature_tuning", default_attn_temperature_tuning)\n',
                    "        vllm_config.model_config.hf_config.attn_temperature_tuning \\\n"
                    '            = gen_config.get("attn_temperature_tuning", False)\n',
                )
            ]
        },
        "the default of Llama 4's attention temperature tuning (the position-dependent query scale of the NoPE "
        "layers) back to off for every context length",
    ),
    Case(
        "vllm-16912",
        "vllm-project/vllm#16912, #16904 (GLM: the Llama attention's rotary embedding halved after construction, "
        "`layer.self_attn.rotary_emb.rotary_dim //= 2` in every layer; get_rope returns one cached RotaryEmbedding "
        "shared by all layers, so rotary_dim became 64, 32, 16, ..., 0; the fix sets partial_rotary_factor = 0.5 "
        "before the model is built instead)",
        *V10,
        {
            "vllm/model_executor/models/glm.py": [
                (
                    "        vllm_config.model_config.hf_config.partial_rotary_factor = 0.5\n"
                    "        super().__init__(vllm_config=vllm_config, prefix=prefix)\n",
                    "        super().__init__(vllm_config=vllm_config, prefix=prefix)\n",
                ),
                (
                    "            if not isinstance(layer, PPMissingLayer):\n"
                    "                layer.self_attn.rotary_emb.is_neox_style = False\n",
                    "            if not isinstance(layer, PPMissingLayer):\n"
                    "                layer.self_attn.rotary_emb.rotary_dim //= 2\n"
                    "                layer.self_attn.rotary_emb.is_neox_style = False\n",
                ),
            ]
        },
        "GLM's half rotary dimension applied again by mutating each layer's rotary embedding after construction "
        "(a shared, cached object: halved once per layer) instead of partial_rotary_factor before it (the pre-fix "
        "form as #16904 quotes it; the fix also dropped the SupportsV0Only marker, not put back here: this release "
        "has no V0 engine to fall back to)",
    ),
    Case(
        "vllm-43770",
        "vllm-project/vllm#43770 (bailing_moe: Ling-flash-2.0 and AntAngelMed set partial_rotary_factor = 0.5 and no "
        "rotary_dim; the attention took rotary_dim from the config or else the whole head_dim, so it wrote "
        "partial_rotary_factor = 1 back into rope_parameters and the rotary embedding rotated the whole head)",
        *V33,
        {
            "vllm/model_executor/models/bailing_moe.py": [
                (
                    '        rotary_dim = getattr(config, "rotary_dim", None)\n'
                    "        if rotary_dim is None:\n"
                    '            partial_rotary_factor = getattr(config, "partial_rotary_factor", 1.0)\n'
                    "            rotary_dim = int(self.head_dim * partial_rotary_factor)\n"
                    "        if rotary_dim is None:\n",
                    '        rotary_dim = getattr(config, "rotary_dim", None)\n        if rotary_dim is None:\n',
                )
            ]
        },
        "the config's partial_rotary_factor no longer consulted when rotary_dim is absent, so the rotary dimension "
        "falls back to the whole head and partial_rotary_factor is overwritten with 1 (the PR quotes the pre-fix "
        "logic as `rotary_dim = getattr(config, 'rotary_dim', self.head_dim)`; the release's second "
        "`if rotary_dim is None` fallback is kept, which reads the same)",
    ),
]
