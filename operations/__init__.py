"""sparkfold's pyinfra operations: one module per concern, facts in operations.facts."""
