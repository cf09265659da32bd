"""The Megatron-core backend: megatron-core models trained by Ray workers."""
