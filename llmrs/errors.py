"""Errors a user can cause. The CLI prints them as one line (exit code 2); the server maps them to 400s."""


class UserError(Exception):
    """A mistake in the user's input (bad path, bad file, bad parameter): reported, never a traceback."""
