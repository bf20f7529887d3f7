"""runnel: CLI, configuration and node composition."""
