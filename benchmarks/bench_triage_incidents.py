"""Triage on public incidents: each culprit is a fix from vLLM or SGLang reversed (re-created against
the PyPI wheel of a release that has the fix, so the diff is what a user of that release would have
met without it), triaged together with decoys made by rule on the same file (never written per case):

- ``comment``: a comment line above the culprit's first edited line (inert);
- ``message``: a logger message reworded, else a docstring added to the culprit's function (inert);
- ``rewrite``: an equal rewrite on the AST: ``x *= a`` -> ``x.mul_(a)``, else ``v == "c"`` ->
  ``v in ("c",)``, else a local renamed through its function (inert);
- ``precision``: a risky-but-innocent precision change: the first ``torch.float32`` / ``.float()``
  outside the culprit's function (or in another file of the same package) made ``bfloat16``.

Wheels are downloaded once with pip into ``~/.cache/speedtrap/incidents`` (``SPEEDTRAP_INCIDENTS_DIR``)
and unpacked there (Python and text files only); nothing is written into the clone.

Run: ``python benchmarks/bench_triage_incidents.py [--markdown] [--json OUT]``
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from speedtrap.triage import PatchReport, from_diff_files, triage

CACHE = Path(os.environ.get("SPEEDTRAP_INCIDENTS_DIR", Path.home() / ".cache" / "speedtrap" / "incidents"))
_KEEP = (".py", ".json", ".txt", ".md", ".yaml")


@dataclass(frozen=True)
class Case:
    id: str
    source: str  # the public PR/issue the culprit comes from
    package: str
    version: str
    edits: dict[str, list[tuple[str, str]]]  # file -> (old, new) edits that make the culprit
    what: str
    factor: str | None = None  # a factor case: the warning must name these sites
    sites: tuple[tuple[str, str], ...] = ()  # (file, code on the line) the warning must name
    base: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # edits that make the base tree
    held_out: str = ""  # which held-out set ("fifth set"): added after the last change to the analysis, measured once


V33, V10, S410, S51, S523, LCP = (
    ("vllm", "0.33.0"),
    ("vllm", "0.10.1.1"),
    ("sglang", "0.4.10"),
    ("sglang", "0.5.1"),
    ("sglang", "0.5.23"),
    ("llama_cpp_python", "0.3.16"),
)
# Packages published as sdists (C++ sources vendored): which folders of the sdist are unpacked.
SDIST_DIRS = {
    "llama_cpp_python": (
        "llama_cpp/",
        "vendor/llama.cpp/src/",
        "vendor/llama.cpp/include/",
        "vendor/llama.cpp/common/",
        "vendor/llama.cpp/gguf-py/gguf/",
    )
}
_KEEP_C = (".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh")
FMOE = "vllm/model_executor/layers/fused_moe/layer.py"
DSV2 = "vllm/model_executor/models/deepseek_v2.py"
FMOE_10 = FMOE  # the same path in 0.10.1.1

CASES = [
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
    # Formerly held out (measured once before the analysis changed after them; developed on since).
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
    # Formerly held out, second set: their misses were read and the general weaknesses behind them fixed.
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
    # Formerly held out, third set (dca5260, measured once at 0/2): the weaknesses they showed (a C-family scale
    # argument, a statement-level identity selection) were fixed after reading them, so they are developed on now.
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
    # Formerly held out, fourth set: committed (7840e30) before triage ran on them and measured once at b3bfc40
    # (1/5 in tier 1, and a reworded log message of sglang-10400 not proven inert); the weaknesses they showed
    # (a normaliser multiply, C-family precision requests, the text of a log call that computes) were then fixed,
    # so they are developed on now.
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
    # Held out, fifth set: written and committed before triage ran on them (the analysis at 8531657, after the
    # fourth set's fixes); measured once. Left out while looking: vllm#31175 (MiMo-V2 v_scale: the pre-fix code
    # could not be read), llama.cpp#13951 (Gemma 2/3 attention scale: the pre-fix graph code could not be read),
    # sglang#28237 (fused shared-expert weight on the aiter/DeepEP path: refactored in 0.5.23 into a helper with
    # several callers, so no faithful single reversal).
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
        held_out="fifth set",
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
        held_out="fifth set",
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
        held_out="fifth set",
    ),
]


def _download(package: str, version: str, sdist: bool) -> Path:
    """The package's wheel (or sdist) from PyPI, downloaded once into the cache."""
    folder = CACHE / ("sdists" if sdist else "wheels")
    pattern = f"{package}-{version}.tar.gz" if sdist else f"{package}-{version}-*.whl"
    found = sorted(folder.glob(pattern))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        only = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
        spec = f"{package.replace('_', '-')}=={version}" if sdist else f"{package}=={version}"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *only, "--disable-pip-version-check", "-q"]
        subprocess.run([*cmd, spec, "-d", str(folder)], check=True, timeout=1800)
        found = sorted(folder.glob(pattern))
    return found[0]


def tree_of(package: str, version: str) -> Path:
    tree = CACHE / "trees" / f"{package}-{version}"
    if package in SDIST_DIRS:
        if not (tree / SDIST_DIRS[package][0]).is_dir():
            with tarfile.open(_download(package, version, sdist=True)) as tf:
                for m in tf.getmembers():
                    rel = m.name.split("/", 1)[1] if "/" in m.name else ""
                    if m.isfile() and rel.startswith(SDIST_DIRS[package]) and rel.endswith(_KEEP + _KEEP_C):
                        m.name = rel
                        tf.extract(m, tree, filter="data")
        return tree
    if not (tree / package).is_dir():
        with zipfile.ZipFile(_download(package, version, sdist=False)) as zf:
            names = [n for n in zf.namelist() if n.startswith(f"{package}/") and n.endswith(_KEEP)]
            zf.extractall(tree, names)
    return tree


def _apply(text: str, edits: list[tuple[str, str]], where: str) -> str:
    """Each edit's old text must occur once; an old text prefixed with ``ALL:`` is replaced everywhere."""
    for old, new in edits:
        every = old.startswith("ALL:")
        old = old.removeprefix("ALL:")
        if text.count(old) != 1 and not (every and text.count(old) > 1):
            raise SystemExit(f"{where}: the edit's old text occurs {text.count(old)} times: {old[:60]!r}")
        text = text.replace(old, new)
    return text


def _udiff(rel: str, before: str, after: str) -> str:
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True), f"a/{rel}", f"b/{rel}"))


def _first_line(before: str, edits: list[tuple[str, str]]) -> int:
    return before[: before.index(edits[0][0].removeprefix("ALL:"))].count("\n") + 1


def _function_at(tree: ast.Module, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    best = None
    for n in ast.walk(tree):
        inside = isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno <= line <= (n.end_lineno or 0)
        if inside and (best is None or n.lineno >= best.lineno):
            best = n
    return best


def _decoy_comment(text: str, line: int, mark: str = "#") -> str | None:
    lines = text.split("\n")
    indent = re.match(r"\s*", lines[line - 1]).group(0)  # type: ignore[union-attr]
    lines.insert(line - 1, f"{indent}{mark} decoy: a comment only")
    return "\n".join(lines)


_LOG = re.compile(r"(logger\.(?:info|debug|warning|info_once|warning_once|debug_once)\(\s*)([\"'])")


def _decoy_message(text: str, tree: ast.Module, line: int) -> str | None:
    m = _LOG.search(text)
    if m:
        return text[: m.end()] + "[decoy] " + text[m.end() :]
    func = _function_at(tree, line)
    if func is None or not func.body:
        return None
    lines = text.split("\n")
    body = func.body[0]
    indent = re.match(r"\s*", lines[body.lineno - 1]).group(0)  # type: ignore[union-attr]
    lines.insert(body.lineno - 1, f'{indent}"""Decoy docstring."""')
    return "\n".join(lines)


def _decoy_rewrite(text: str, tree: ast.Module) -> str | None:
    lines = text.split("\n")
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.AugAssign)
            and isinstance(n.op, ast.Mult)
            and n.lineno == n.end_lineno
            and isinstance(n.target, ast.Name)
        ):
            src = lines[n.lineno - 1]
            seg = ast.get_source_segment(text, n)
            if seg and src.count(seg) == 1:
                lines[n.lineno - 1] = src.replace(seg, f"{n.target.id}.mul_({ast.get_source_segment(text, n.value)})")
                return "\n".join(lines)
    for n in ast.walk(tree):
        if (
            isinstance(n, ast.Compare)
            and len(n.ops) == 1
            and isinstance(n.ops[0], ast.Eq)
            and isinstance(n.comparators[0], ast.Constant)
            and isinstance(n.comparators[0].value, str)
            and n.lineno == n.end_lineno
        ):
            seg = ast.get_source_segment(text, n.comparators[0])
            src = lines[n.lineno - 1]
            old = f"== {seg}"
            if seg and src.count(old) == 1:
                lines[n.lineno - 1] = src.replace(old, f"in ({seg},)")
                return "\n".join(lines)
    return None


def _decoy_precision(text: str, tree: ast.Module, line: int) -> str | None:
    func = _function_at(tree, line)
    skip = range(func.lineno, (func.end_lineno or func.lineno) + 1) if func else range(0)
    lines = text.split("\n")
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr == "float32" and n.lineno not in skip:
            src = lines[n.lineno - 1]
            if src.count("torch.float32") == 1:
                lines[n.lineno - 1] = src.replace("torch.float32", "torch.bfloat16")
                return "\n".join(lines)
    return None


@dataclass
class Result:
    case: Case
    culprit: PatchReport | None = None
    decoys: dict[str, PatchReport] = field(default_factory=dict)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)
    sites_named: bool | None = None
    notes: list[str] = field(default_factory=list)


def _site_lines(tree: Path, sites: tuple[tuple[str, str], ...], culprit_files: dict[str, str]) -> list[str]:
    out = []
    for rel, code in sites:
        text = culprit_files.get(rel) or (tree / rel).read_text()
        stmts = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.stmt) and not hasattr(n, "body")]
        nos: list[int] = []
        for i, ln in enumerate(text.split("\n"), 1):
            if code in ln:  # any line of the statement holding it names the site
                span = [s for s in stmts if s.lineno <= i <= (s.end_lineno or s.lineno)]
                nos.extend(range(span[0].lineno, (span[0].end_lineno or i) + 1) if span else [i])
        out.append("|".join(f"{rel}:{n}" for n in sorted(set(nos))) or rel)
    return out


def run_case(case: Case, work: Path) -> Result:
    res = Result(case)
    tree = tree_of(case.package, case.version)
    if case.base:
        base = work / "base"
        shutil.copytree(tree, base, copy_function=os.link)
        for rel, edits in case.base.items():
            path = base / rel
            text = _apply(path.read_text(), edits, f"{case.id} base {rel}")
            path.unlink()
            path.write_text(text)
        tree = base
    diffs: list[Path] = []
    after: dict[str, str] = {}
    culprit = []
    for rel, edits in case.edits.items():
        before = (tree / rel).read_text()
        after[rel] = _apply(before, edits, f"{case.id} {rel}")
        culprit.append(_udiff(rel, before, after[rel]))
    (work / "culprit.diff").write_text("".join(culprit))
    diffs.append(work / "culprit.diff")
    rel, edits = next(iter(case.edits.items()))
    before = (tree / rel).read_text()
    line = _first_line(before, edits)
    if rel.endswith(".py"):
        parsed = ast.parse(before)
        makers = {
            "comment": lambda: _decoy_comment(before, line),
            "message": lambda: _decoy_message(before, parsed, line),
            "rewrite": lambda: _decoy_rewrite(before, parsed),
            "precision": lambda: _decoy_precision(before, parsed, line),
        }
    else:  # C-family: only the comment rule applies
        makers = {"comment": lambda: _decoy_comment(before, line, "//")}
    for name, make in makers.items():
        text = make()
        if text is None or text == before:
            res.notes.append(f"no {name} decoy in {rel}")
            continue
        (work / f"{name}.diff").write_text(_udiff(rel, before, text))
        diffs.append(work / f"{name}.diff")
    start = time.process_time()
    report = triage(from_diff_files(diffs, tree), case.factor)
    res.seconds = time.process_time() - start
    by_name = {p.name: p for p in report.patches}
    res.culprit = by_name["culprit"]
    res.decoys = {k: v for k, v in by_name.items() if k != "culprit"}
    res.warnings = [d.message for d in res.culprit.doubles] + list(res.culprit.missing)
    if case.factor:
        wanted = _site_lines(tree, case.sites, after)
        text = "\n".join(res.warnings)
        res.sites_named = bool(res.warnings) and all(any(w in text for w in alt.split("|")) for alt in wanted)
        if not res.sites_named:
            res.notes.append(f"wanted sites {wanted}")
    return res


def _summary(res: Result) -> dict[str, Any]:
    assert res.culprit is not None
    return {
        "id": res.case.id,
        "source": res.case.source,
        "release": f"{res.case.package} {res.case.version}",
        "what": res.case.what,
        "culprit_tier": res.culprit.tier,
        "culprit_reason": res.culprit.ranking.reasons[0] if res.culprit.ranking.reasons else "",
        "warnings": len(res.warnings),
        "factor_case": res.case.factor is not None,
        "held_out": res.case.held_out,
        "sites_named": res.sites_named,
        "decoy_tiers": {k: v.tier for k, v in res.decoys.items()},
        "seconds": round(res.seconds, 2),
        "notes": res.notes,
        "warning_text": res.warnings[:2],
    }


def _markdown(rows: list[dict[str, Any]]) -> str:
    out = [
        "| incident | release | culprit tier | warnings (right sites) | decoys: comment / message / rewrite "
        "/ precision | CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        d = r["decoy_tiers"]
        decoys = " / ".join(str(d.get(k, "-")) for k in ("comment", "message", "rewrite", "precision"))
        named = "" if not r["factor_case"] else (" (yes)" if r["sites_named"] else " (no)")
        held = f" (held out, {r['held_out']})" if r.get("held_out") else ""
        out.append(
            f"| {r['id']}{held} | {r['release']} | {r['culprit_tier']} | {r['warnings']}{named} | {decoys} "
            f"| {r['seconds']:.2f} |"
        )
    out.append("")
    out.append(_totals("all", rows))
    dev = [r for r in rows if not r.get("held_out")]
    held_rows = [r for r in rows if r.get("held_out")]
    if dev and held_rows:
        out.append(_totals("developed on", dev))
        sets = ", ".join(sorted({r["held_out"] for r in held_rows}))
        out.append(_totals(f"held out ({sets})", held_rows))
    return "\n".join(out)


def _totals(label: str, rows: list[dict[str, Any]]) -> str:
    n = len(rows)
    t1 = sum(r["culprit_tier"] == 1 for r in rows)
    factor = [r for r in rows if r["factor_case"]]
    inert = [r["decoy_tiers"][k] for r in rows for k in ("comment", "message", "rewrite") if k in r["decoy_tiers"]]
    return (
        f"{label.capitalize()} ({n}): culprit in tier 1: {t1}/{n} ({100 * t1 / n:.0f} %); tier 2: "
        f"{sum(r['culprit_tier'] == 2 for r in rows)}; tier 3: {sum(r['culprit_tier'] == 3 for r in rows)}. "
        f"Inert decoys above tier 3: {sum(t != 3 for t in inert)} of {len(inert)}. "
        f"Factor cases with a warning naming the right sites: "
        f"{sum(bool(r['sites_named']) for r in factor)}/{len(factor)}. "
        f"Precision decoys: tiers {[r['decoy_tiers'].get('precision', '-') for r in rows]}."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print the table in Markdown")
    ap.add_argument("--json", type=Path, help="write every row as JSON here")
    ap.add_argument("--only", help="run only the case with this id")
    args = ap.parse_args()
    rows = []
    for case in CASES:
        if args.only and case.id != args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            row = _summary(run_case(case, Path(tmp)))
        rows.append(row)
        if not args.markdown:
            print(json.dumps(row, indent=1))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(_markdown(rows))


if __name__ == "__main__":
    main()
