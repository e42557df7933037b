"""The engine image's content-addressed reference (computed on this machine from the build context)."""
