"""Fixtures for the `llmrs bench` tests: a tiny OpenAI-style server with exact, known token timing."""
