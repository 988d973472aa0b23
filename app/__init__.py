"""ReconStudio entry points: the `reconstudio` command (GUI and CLI subcommands)."""
