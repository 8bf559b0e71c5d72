"""Incidents from llama.cpp, on the sources vendored in the llama-cpp-python 0.3.16 sdist: each a public fix
reversed onto the release's C++ file."""

from __future__ import annotations

from .case import LCP, Case

CASES: list[Case] = [
    Case(
        "llama.cpp-14892",
        "ggml-org/llama.cpp#14892 (PLaMo2 attention: kq_scale passed as 1.0 instead of 1/sqrt(head_dim), "
        "output quality collapsed)",
        *LCP,
        {
            "vendor/llama.cpp/src/llama-model.cpp": [
                (
                    "Qcur, Kcur, Vcur, NULL, NULL, 1.0f/sqrtf(float(n_embd_head_v)), il);\n",
                    "Qcur, Kcur, Vcur, NULL, NULL, 1.0f, il);\n",
                )
            ]
        },
        "the attention scale at a kernel call replaced by the identity 1.0 (C++, llama.cpp vendored in "
        "llama-cpp-python)",
    ),
    Case(
        "llama.cpp-10015",
        "ggml-org/llama.cpp#10015 (KQ multiplication in F32 by default: the per-architecture list kept missing "
        "models that overflow in F16; before it, only PHI2/PHI3/GPTNEOX/QWEN2/NEMOTRON/CHATGLM got F32)",
        *LCP,
        {
            "vendor/llama.cpp/src/llama-graph.cpp": [
                (
                    "        // note: this op tends to require high floating point range\n"
                    "        //       while for some models F16 is enough, for others it is not, "
                    "so we default to F32 here\n"
                    "        ggml_mul_mat_set_prec(kq, GGML_PREC_F32);\n",
                    "        if (arch == LLM_ARCH_PHI2 || arch == LLM_ARCH_PHI3 || arch == LLM_ARCH_GPTNEOX ||\n"
                    "            arch == LLM_ARCH_QWEN2 || arch == LLM_ARCH_NEMOTRON || arch == LLM_ARCH_CHATGLM) {\n"
                    "            // for this arch, we need to perform the KQ multiplication with F32 precision, "
                    "otherwise we get NaNs\n"
                    "            ggml_mul_mat_set_prec(kq, GGML_PREC_F32);\n        }\n",
                )
            ]
        },
        "F32 KQ precision narrowed back to a list of architectures (the fix reversed; `model.arch` is `arch` in "
        "this release's llm_graph_context)",
    ),
    Case(
        "llama.cpp-13101",
        "ggml-org/llama.cpp#13101 (force FP32 compute in GLM4 FFN down: FP16 accumulators overflow, incoherent "
        "output, #12946)",
        *LCP,
        {
            "vendor/llama.cpp/src/llama-graph.cpp": [
                (
                    "        cur = build_lora_mm(down, cur);\n"
                    "        if (arch == LLM_ARCH_GLM4 || arch == LLM_ARCH_GLM4_MOE) {\n"
                    "            // GLM4 and GLM4_MOE seem to have numerical issues with half-precision accumulators\n"
                    "            ggml_mul_mat_set_prec(cur, GGML_PREC_F32);\n        }\n",
                    "        cur = build_lora_mm(down, cur);\n",
                )
            ]
        },
        "the F32 precision of GLM4's FFN down projection removed (C++)",
    ),
    Case(
        "llama.cpp-13260",
        "ggml-org/llama.cpp#13260 (PLaMo's RoPE type is NeoX: PLaMo was broken for over a year by the normal, "
        "consecutive-pair RoPE)",
        *LCP,
        {
            "vendor/llama.cpp/src/llama-model.cpp": [
                (
                    "        case LLM_ARCH_STARCODER:\n        case LLM_ARCH_INTERNLM2:\n",
                    "        case LLM_ARCH_STARCODER:\n        case LLM_ARCH_PLAMO:\n"
                    "        case LLM_ARCH_INTERNLM2:\n",
                ),
                (
                    "        case LLM_ARCH_PHIMOE:\n        case LLM_ARCH_PLAMO:\n        case LLM_ARCH_PLAMO2:\n",
                    "        case LLM_ARCH_PHIMOE:\n        case LLM_ARCH_PLAMO2:\n",
                ),
            ]
        },
        "PLaMo moved back from the NeoX RoPE list to the normal RoPE list in llama_model_rope_type (C++)",
    ),
    Case(
        "llama.cpp-13870",
        "ggml-org/llama.cpp#13870 (KV cache shift for Qwen2-VL / Qwen2.5-VL, #13865: shifting a cache roped with "
        "M-RoPE used the M-RoPE type, and generation after a context shift broke; the fix rotates with NeoX RoPE)",
        *LCP,
        {
            "vendor/llama.cpp/src/llama-kv-cache-unified.cpp": [
                (
                    "    const auto & rope_type = hparams.rope_type == LLAMA_ROPE_TYPE_MROPE\n"
                    "                                // @ngxson : this is a workaround\n"
                    "                                // for M-RoPE, we want to rotate the whole vector when doing "
                    "KV shift\n"
                    "                                // a normal RoPE should work, we just need to use the correct "
                    "ordering\n"
                    "                                // ref: https://github.com/ggml-org/llama.cpp/pull/13870\n"
                    "                                ? LLAMA_ROPE_TYPE_NEOX\n"
                    "                                : hparams.rope_type;\n",
                    "    const auto & rope_type = hparams.rope_type;\n",
                )
            ]
        },
        "the KV-cache shift's RoPE type back to the model's own for M-RoPE models (C++, build_rope_shift)",
    ),
    Case(
        "llama.cpp-14850",
        "ggml-org/llama.cpp#14850 (MiniCPM gibberish after the Granite Four PR #13550: MiniCPM builds its graph with "
        "llm_build_granite, which now applies RoPE only when hparams.rope_finetuned is set, and MiniCPM's loader did "
        "not set it; the fix sets it for LLM_ARCH_MINICPM)",
        *LCP,
        {
            "vendor/llama.cpp/src/llama-model.cpp": [
                (
                    "                ml.get_key(LLM_KV_LOGIT_SCALE,                 hparams.f_logit_scale);\n\n"
                    "                // MiniCPM uses rope by default, unlike Granite which uses it as a switch\n"
                    "                hparams.rope_finetuned = true;\n\n",
                    "                ml.get_key(LLM_KV_LOGIT_SCALE,                 hparams.f_logit_scale);\n\n",
                )
            ]
        },
        "MiniCPM's loader no longer sets the flag the shared Granite graph reads as its RoPE switch, so its attention "
        "runs without RoPE (C++; the PR's first part, an enum value restored, is not in the merged fix as released "
        "and is not reversed)",
    ),
]
