"""`python -m llmrs ...` (guarded: spawned worker processes re-import __main__ and must not re-run the CLI)."""

from llmrs.cli import main

if __name__ == "__main__":
    main()
