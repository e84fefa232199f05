"""The Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, SmolLM2), Gemma 3, and their config."""

from engine.models.config import ModelConfig, RopeConfig
from engine.models.gemma import GemmaForCausalLM
from engine.models.llama import LlamaForCausalLM

__all__ = ["GemmaForCausalLM", "LlamaForCausalLM", "ModelConfig", "RopeConfig"]
