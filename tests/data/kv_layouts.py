"""Tiny configs of each attention layout (2-4 layers, 64 wide), and Falcon-7B's published
config.json keys that shape its attention. Nothing is downloaded.

``TINY_LAYOUTS``: name -> (config dict, the layout's kind as ``attention.read_attention`` names it).
"""

from __future__ import annotations

_BASE = {"hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 4, "vocab_size": 128}

TINY_LAYOUTS = {
    "falcon multi_query": (
        {
            **_BASE,
            "model_type": "falcon",
            "num_hidden_layers": 2,
            "multi_query": True,
            "new_decoder_architecture": False,
        },
        "multi-query",
    ),
    "falcon new_decoder_architecture": (
        {**_BASE, "model_type": "falcon", "num_hidden_layers": 2, "num_kv_heads": 2, "new_decoder_architecture": True},
        "multi-head",
    ),
    "gpt_bigcode multi_query": (
        {"model_type": "gpt_bigcode", "n_embd": 64, "n_head": 4, "n_layer": 2, "vocab_size": 128, "multi_query": True},
        "multi-query",
    ),
    "llama grouped": (
        {**_BASE, "model_type": "llama", "num_hidden_layers": 2, "num_key_value_heads": 2},
        "grouped-query",
    ),
    "llama kv heads null": (
        {**_BASE, "model_type": "llama", "num_hidden_layers": 2, "num_key_value_heads": None},
        "multi-head",
    ),
    "mistral sliding": (
        {**_BASE, "model_type": "mistral", "num_hidden_layers": 2, "num_key_value_heads": 2, "sliding_window": 8},
        "grouped-query",
    ),
    "gemma2 hybrid": (
        {
            **_BASE,
            "model_type": "gemma2",
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": 8,
        },
        "grouped-query",
    ),
    "deepseek_v3 latent": (
        {
            **_BASE,
            "model_type": "deepseek_v3",
            "num_hidden_layers": 2,
            "num_key_value_heads": 4,
            "moe_intermediate_size": 16,
            "kv_lora_rank": 16,
            "q_lora_rank": 16,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "n_shared_experts": 1,
            "first_k_dense_replace": 1,
            "n_group": 1,
            "topk_group": 1,
        },
        "latent",
    ),
    "gemma3n shared cache": (
        {
            **_BASE,
            "model_type": "gemma3n_text",
            "num_hidden_layers": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "sliding_window": 8,
            "num_kv_shared_layers": 2,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "laurel_rank": 4,
            "altup_num_inputs": 2,
            "hidden_size_per_layer_input": 8,
            "vocab_size_per_layer_input": 128,
            "activation_sparsity_pattern": [0.0, 0.0, 0.0, 0.0],
        },
        "grouped-query",
    ),
}

FALCON_7B = {
    "model_type": "falcon",
    "vocab_size": 65024,
    "hidden_size": 4544,
    "num_hidden_layers": 32,
    "num_attention_heads": 71,
    "multi_query": True,
    "new_decoder_architecture": False,
    "parallel_attn": True,
    "bias": False,
    "alibi": False,
    "torch_dtype": "bfloat16",
}
"""tiiuae/falcon-7b's config.json (the keys that shape it): 71 query heads of 64, one K/V head."""
FALCON_7B_KV_BYTES_PER_TOKEN = 8192
"""Its published bf16 KV cache per token: 32 layers x 1 K/V head x 64 x 2 (K, V) x 2 B."""

QWEN3_NEXT_TINY = {
    **_BASE,
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 16,
}
"""Linear-attention layers (state, not K/V) beside full-attention ones: a cache not read per token."""
