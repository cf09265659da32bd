"""Rollouts: the runner that plays many episodes against an inference engine, the token-level
record of each episode, and trajectories on disk as JSONL."""
