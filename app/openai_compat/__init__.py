"""The OpenAI Chat Completions face of SABRE: ``POST /v1/chat/completions`` and ``GET /v1/models``."""
