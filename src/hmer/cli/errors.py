"""How a command says the user asked for something wrong: one line on stderr, exit status 2."""

EXIT_USAGE = 2


class UserError(Exception):
    """An error in what the user asked for; printed as one line, exit status 2."""
