"""One module per `ddpdoctor` subcommand: `add_arguments(parser)` and `run(args) -> exit code`."""
