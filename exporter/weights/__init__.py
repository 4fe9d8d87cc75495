"""Checkpoint reading, name plans, fused-tensor splits, sharding and loading."""
