"""vllm-platform: the Pulumi program, typed config, AWS layer, offline renderer and CLI."""
