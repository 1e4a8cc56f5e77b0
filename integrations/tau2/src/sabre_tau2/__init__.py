"""SABRE as a tau2-bench agent: ``tau2-sabre run --agent sabre --agent-llm sabre ...``."""
