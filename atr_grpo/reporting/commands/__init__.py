"""One module per `python -m atr_grpo.results` subcommand: `add_arguments(parser)` and `run(opts, parser)`."""
