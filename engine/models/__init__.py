"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, SmolLM2) and its config."""

from engine.models.config import ModelConfig, RopeConfig
from engine.models.llama import LlamaForCausalLM

__all__ = ["LlamaForCausalLM", "ModelConfig", "RopeConfig"]
