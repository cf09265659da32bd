"""Rewards: rubrics of weighted reward functions, and ready-made ones (exact match, format, math
verification, an LLM judge, code run on test cases in a sandbox)."""
