"""``python -m axiomformer ...``: the same command-line interface as the ``axiomformer`` script."""

from axiomformer.cli import app

app()
