"""Test suite for megatron_burst (CPU by default; GPU modules skip without CUDA)."""
