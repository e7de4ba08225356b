"""One module per CLI command; each exposes ``register(app: typer.Typer)`` and imports heavy libraries lazily."""
