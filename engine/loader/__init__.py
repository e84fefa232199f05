"""Loading models and tokenizers from Hugging Face folders, and fetching the default model."""

from engine.loader.default_model import ensure_default_model
from engine.loader.tokenizer import Tokenizer, load_tokenizer
from engine.loader.weights import load_model, model_digest

__all__ = ["Tokenizer", "ensure_default_model", "load_model", "load_tokenizer", "model_digest"]
