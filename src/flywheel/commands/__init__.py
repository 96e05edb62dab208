"""Subcommands of `flywheel`, one module each (see flywheel/cli.py for the contract)."""
