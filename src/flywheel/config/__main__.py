"""`python -m flywheel.config > docs/config.md`: print the config reference."""

from flywheel.config.reference import reference_markdown

print(reference_markdown())
