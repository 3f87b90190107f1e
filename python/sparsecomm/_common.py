"""What the DDP hook and the Sparsifier share."""


def option_texts(options):
    """Keyword options as the CLI's ``-o key=value`` texts (booleans as
    true/false)."""

    def text(value):
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return {key: text(value) for key, value in options.items()}
