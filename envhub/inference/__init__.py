"""Inference engines: the :class:`~envhub.inference.base.InferenceEngine` interface, an engine for
OpenAI-compatible HTTP servers, and a launcher for a local vLLM server."""
