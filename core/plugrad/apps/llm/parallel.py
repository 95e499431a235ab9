"""Tensor parallelism for the LLM: a loaded Transformer's weights and KV caches split over several devices.

Attention is split by KV-head groups (each device gets whole KV heads and the query heads that attend to them: the
q/k/v projections' rows, the output projection's columns, the caches' head axis), the FFN by hidden units (gate/up
rows, down columns), the output layer by vocabulary rows; norms and RoPE tables are replicated. Each block then
needs two allreduces (after the attention output and the FFN down projections, both sums over the split axis), which
schedule/multi.py inserts. Quantized weights are dequantized into float32 shards (the split happens on their values).
"""
from __future__ import annotations

from typing import Sequence

from plugrad.apps.llm.model import Transformer
from plugrad.schedule.multi import even_bounds
from plugrad.tensor import Tensor
from plugrad.uop.ops import UOp


def _sizes(n: int, k: int) -> list[int]: return [e - b for b, e in even_bounds(n, k)]


def _split(u: UOp | None, devices: tuple[str, ...], axis: int, splits: list[int]) -> UOp | None:
  return None if u is None else Tensor(u).shard(devices, axis, splits).realize().uop


def _replicate(u: UOp | None, devices: tuple[str, ...]) -> UOp | None:
  return None if u is None else Tensor(u).to(devices).realize().uop


def shard_transformer(model: Transformer, devices: Sequence[str]) -> Transformer:
  """Split `model` over `devices` in place (see the module docstring) and return it; forward() then takes inputs on
  any one device and returns logits on the device tuple (numpy() gathers them)."""
  devs = tuple(devices)
  c = model.cfg
  if c.n_experts: raise NotImplementedError("tensor parallelism of mixture-of-experts blocks isn't implemented")
  if model.batch != 1: raise NotImplementedError("tensor parallelism is implemented for batch 1 (the Generator)")
  kv = _sizes(c.n_kv_heads, len(devs))   # whole KV heads per device, and their query-head groups
  group = c.n_heads // c.n_kv_heads
  q_rows, kv_rows, ffn = [n * group * c.head_dim for n in kv], [n * c.head_dim for n in kv], _sizes(c.ffn_dim, len(devs))
  for layer in model.layers:
    layer.attn_norm, layer.ffn_norm = _replicate(layer.attn_norm, devs), _replicate(layer.ffn_norm, devs)
    layer.q_norm, layer.k_norm = _replicate(layer.q_norm, devs), _replicate(layer.k_norm, devs)
    layer.wq, layer.bq = _split(layer.wq, devs, 0, q_rows), _split(layer.bq, devs, 0, q_rows)
    layer.wk, layer.bk = _split(layer.wk, devs, 0, kv_rows), _split(layer.bk, devs, 0, kv_rows)
    layer.wv, layer.bv = _split(layer.wv, devs, 0, kv_rows), _split(layer.bv, devs, 0, kv_rows)
    layer.wo = _split(layer.wo, devs, 1, q_rows)
    layer.w_gate, layer.w_up, layer.w_down = _split(layer.w_gate, devs, 0, ffn), _split(layer.w_up, devs, 0, ffn), _split(layer.w_down, devs, 1, ffn)
    layer.cache_k = layer.cache_k.shard(devs, 1, kv).realize()
    layer.cache_v = layer.cache_v.shard(devs, 1, kv).realize()
    layer.dense = {}   # prefill reads the (float32) shards directly
  model.output = _split(model.output, devs, 0, _sizes(c.vocab_size, len(devs)))
  model.norm = _replicate(model.norm, devs)
  model.cos, model.sin = model.cos.to(devs).realize(), model.sin.to(devs).realize()
  model.devices = devs
  return model
