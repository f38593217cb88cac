"""The ``hf`` workload: a ``transformers`` causal LM built from a config, random weights."""

from __future__ import annotations

import functools
import inspect
import json
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

from memsweep.conf.contract import hf_config_kind, version_tuple

from . import hf_dry
from .errors import DependencyMissing
from .lora import apply_lora, import_peft, lora_info
from .pretrained import checkpoint_info, is_quantized, load_pretrained
from .transformer import TokenWorkload


class HfWorkload(TokenWorkload):
    """A ``transformers`` causal LM from a config, random weights (AutoModelForCausalLM.from_config).

    ``config``: a config class name (``LlamaConfig(**overrides)``), a model type
    (``AutoConfig.for_model("gpt2", **overrides)``) or a local config.json / directory holding
    one (read as JSON, then ``overrides`` applied). Hub downloads are disabled
    (HF_HUB_OFFLINE=1). Generation passes the cache explicitly: a DynamicCache (created by the
    model at the prefill) or a StaticCache of context + new_tokens tokens.
    """

    name = "hf"
    peft_model: nn.Module | None = None  # the PeftModel (adapt_model), before any torch.compile

    def prepare(self) -> None:
        """Import transformers (optional: imported here, before the first phase, only for
        workload=hf) and build the config.

        Raises:
            DependencyMissing: transformers (or the optimizer's package) is not installed.
            ValueError: an unknown config class, a config.json without model_type, or more
                tokens than the model's positions.
        """
        super().prepare()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import transformers  # optional: imported only for workload=hf
        except ImportError as exc:
            raise DependencyMissing(
                f"workload=hf needs the transformers package, which is not installed ({exc}): "
                f"pip install 'memsweep[hf]'"
            ) from None
        self.tf = transformers
        if self.spec.workload["lora_rank"] is not None:
            import_peft()  # DependencyMissing before any phase
        if self.spec.dry_run:  # transformers' branches on fake tensors: those of the real inputs
            self.dry_run_answers = hf_dry.install(transformers)
        self.config = self._config()
        self.vocab = int(self.config.vocab_size)
        limit = getattr(self.config, "max_position_embeddings", None) or getattr(self.config, "n_positions", None)
        tokens = self.spec.context + (self.spec.new_tokens if self.spec.mode == "generate" else 0)
        if isinstance(limit, int) and tokens > limit:
            raise ValueError(
                f"{tokens} tokens (context{' + new_tokens' if self.spec.mode == 'generate' else ''}) "
                f"exceed the model's {limit} positions (max_position_embeddings / n_positions); "
                f"raise it in workload.overrides"
            )

    def _config(self):
        w = self.spec.workload
        if w["pretrained"] is not None:  # the checkpoint's own config.json (overrides still apply)
            return self.tf.AutoConfig.from_pretrained(w["pretrained"], local_files_only=True, **dict(w["overrides"]))
        return hf_config(self.tf, w["config"], w["overrides"])

    def build_model(self) -> nn.Module:
        """``AutoModelForCausalLM.from_config`` in the parameter dtype, the spec's attention; with
        ``workload.pretrained``, ``from_pretrained`` of that local directory (``pretrained.py``)."""
        if self.spec.workload["pretrained"] is not None:
            return load_pretrained(
                self.tf, self.spec.workload, self.config, self.param_dtype, self.compute_dtype, self.device
            )
        dtype_kw = "dtype" if version_tuple(self.tf.__version__) >= (4, 56) else "torch_dtype"  # renamed in 4.56
        model = self.tf.AutoModelForCausalLM.from_config(
            self.config, attn_implementation=self.spec.workload["attention"], **{dtype_kw: self.param_dtype}
        )
        if self.spec.dry_run:  # the model's own module is imported now: watch it too
            self.dry_run_answers = hf_dry.install(self.tf, model)
        return model

    def move_model(self, model: nn.Module) -> None:
        """``Module.to`` the device and dtype, except for a quantized checkpoint (placed by
        ``device_map``; transformers refuses to cast it)."""
        if not is_quantized(model):
            super().move_model(model)

    def adapt_model(self, model: nn.Module) -> nn.Module:
        """LoRA adapters on the model when ``workload.lora_rank`` is set (``lora.apply_lora``)."""
        if self.spec.workload["lora_rank"] is None:
            return model
        self.peft_model = apply_lora(model, self.spec.workload, is_quantized(model))
        return self.peft_model

    def enable_checkpointing(self, model):
        """transformers' gradient (activation) checkpointing, non-reentrant; the model's cache off.

        Raises:
            ValueError: the model does not support gradient checkpointing.
        """
        if not getattr(model, "supports_gradient_checkpointing", False):
            raise ValueError(f"checkpointing=true: {type(model).__name__} does not support gradient checkpointing")
        if hasattr(model, "activation_checkpointing_enable"):  # the name since transformers 5.x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False

    def call(self, inputs):
        """Logits (batch, context, vocab) of ids (batch, context), without a cache."""
        return self._built_model()(input_ids=inputs, use_cache=False).logits

    @functools.cached_property
    def _forward_params(self):
        """The model's forward() parameters, read once (not once per decoded token)."""
        return inspect.signature(self._built_model().forward).parameters

    def _step(self, ids, cache):
        kwargs = {"input_ids": ids, "use_cache": True}
        if cache is not None:
            kwargs["cache" if "cache" in self._forward_params else "past_key_values"] = cache
        if "logits_to_keep" in self._forward_params:
            kwargs["logits_to_keep"] = 1
        out = self._built_model()(**kwargs)
        new_cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
        return out.logits[:, -1:], new_cache

    def prefill(self, ids):
        """(logits (batch, 1, vocab), cache) of prompt ids (batch, context): a DynamicCache the
        model creates, or a StaticCache of context + new_tokens tokens (spec kv_cache=static)."""
        cache = None
        if self.spec.kv_cache == "static":
            capacity = self.spec.context + self.spec.new_tokens
            params = inspect.signature(self.tf.StaticCache.__init__).parameters
            if "max_batch_size" in params:  # transformers 4.x
                cache = self.tf.StaticCache(
                    config=self.config,
                    max_batch_size=ids.shape[0],
                    max_cache_len=capacity,
                    device=self.device,
                    dtype=self.compute_dtype,
                )
            else:
                cache = self.tf.StaticCache(config=self.config, max_cache_len=capacity)
        return self._step(ids, cache)

    def decode(self, token, cache, position):
        """(logits (batch, 1, vocab), cache) for one token (batch, 1) on the cache."""
        return self._step(token, cache)

    def cache_tensors(self, cache):
        """The key and value tensors of a transformers cache (legacy tuples, ``layers`` of
        transformers >= 4.56, or ``key_cache`` / ``value_cache`` lists)."""
        if isinstance(cache, (tuple, list)):  # legacy format: per layer (key, value)
            return [t for layer in cache for t in layer if isinstance(t, torch.Tensor)]
        layers = getattr(cache, "layers", None)
        if layers is not None:
            return [
                t
                for layer in layers
                for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                if isinstance(t, torch.Tensor)
            ]
        return [
            t
            for name in ("key_cache", "value_cache")
            for t in getattr(cache, name, None) or []
            if isinstance(t, torch.Tensor)
        ]

    def model_info(self) -> dict:
        """``Workload.model_info`` plus ``dims`` read from the config (null where it has none)
        and ``hf_config``, the resolved config as JSON (``to_json_string(use_diff=False)``;
        null when it cannot be written)."""
        c = self.config
        heads = getattr(c, "num_attention_heads", None) or getattr(c, "n_head", None)
        hidden = getattr(c, "hidden_size", None) or getattr(c, "n_embd", None)
        dims = {
            "config_class": type(c).__name__,
            "model_class": type(self.peft_model if self.peft_model is not None else self.model).__name__,
            "layers": getattr(c, "num_hidden_layers", None) or getattr(c, "n_layer", None),
            "hidden": hidden,
            "heads": heads,
            "kv_heads": getattr(c, "num_key_value_heads", None) or heads,
            "head_dim": getattr(c, "head_dim", None) or (hidden // heads if hidden and heads else None),
            "vocab": self.vocab,
            "attention": self.spec.workload["attention"],
            "transformers": self.tf.__version__,
        }
        try:  # the resolved config (defaults included), for the estimator's figures beside a prediction
            config = json.loads(c.to_json_string(use_diff=False))
        except (TypeError, ValueError, AttributeError):
            config = None
        info = {**super().model_info(), "dims": dims, "hf_config": config}
        if self.spec.workload["lora_rank"] is not None:
            info["lora"] = lora_info(self.peft_model)
        if self.spec.workload["pretrained"] is not None:
            info["checkpoint"] = checkpoint_info(self.spec.workload)
        return info


def hf_config(tf, config: str, overrides: dict):
    """The transformers config an hf workload's ``config`` setting names, ``overrides`` applied.

    Args:
        tf: the transformers module.
        config: a config class name (``LlamaConfig``), a registered model type (``gpt2``) or a
            local config.json (or its directory); never downloaded.
        overrides: config attributes to set.

    Returns:
        the config object.

    Raises:
        ValueError: an unknown class, or a config.json without ``model_type``.
        FileNotFoundError: no such config.json.
    """
    overrides = dict(overrides)
    kind = hf_config_kind(config)
    if kind == "class":
        cls = getattr(tf, config, None)
        if cls is None:
            raise ValueError(f"workload.config={config!r}: transformers {tf.__version__} has no such class")
        return cls(**overrides)
    if kind == "model_type":
        return tf.AutoConfig.for_model(config, **overrides)
    return config_from_json(tf, config, overrides, where=f"workload.config={config!r}: ")


def config_from_json(tf, path: str | Path, overrides: Mapping | None = None, where: str = ""):
    """The transformers config of a local config.json (or its directory), ``overrides`` applied.

    Args:
        tf: the transformers module.
        path: the config.json, or a directory holding one; never downloaded.
        overrides: config attributes to set.
        where: what the error message starts with (the setting that named ``path``).

    Raises:
        FileNotFoundError: no such file.
        ValueError: no ``model_type``, or one this transformers does not know.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        path = path / "config.json"
    data = json.loads(path.read_text())
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ValueError(f"{where}{path} has no model_type")
    data.update(overrides or {})
    return tf.AutoConfig.for_model(model_type, **data)
