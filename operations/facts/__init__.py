"""Read-only facts sparkfold's operations decide from. Every fact exits 0."""
