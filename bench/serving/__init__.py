"""GPU serving benchmark: the stack's own vLLM configuration against vLLM's defaults and a
Hugging Face Transformers baseline (bench/serving/README.md)."""
